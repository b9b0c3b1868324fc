#pragma once
// The byte-level pushdown matcher of one sequence: which grammar positions the output so far can
// be in, advanced one byte at a time.
//
// State: a set of stacks. A stack is a chain of immutable frames in an arena (a frame is a
// grammar position -- an element index -- plus a repetition count, and its parent frame, the
// position to return to). Every stack in the set is "ready": its top is a byte terminal. Moving
// past a byte keeps the stacks whose top accepts it, steps past the terminal and expands until the
// tops are terminals again (entering rules, returning from them, looping or leaving repetitions).
// A stack that returns from the root rule means the input so far is a complete sentence
// (can_end()). Tail calls and unbounded repetition counts are canonical, so a loop such as the
// characters of a JSON string keeps one unchanged state from byte to byte.
//
// Frames are shared between stacks and never modified; the arena only grows while bytes are
// consumed and is compacted by compact() (after each accepted token). Speculative walks (the token
// mask) push frames and roll the arena back with mark()/rollback().
//
// Thread safety: one matcher per sequence; not safe for concurrent use. The grammar is shared
// read-only.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "pagoda/grammar/grammar.h"

namespace pagoda::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // A state: the ready stack tops plus whether the input so far is complete.
  struct State {
    std::vector<int32_t> tops;
    bool can_end = false;
    bool dead() const { return tops.empty() && !can_end; }
  };

  const State& state() const { return state_; }
  bool can_end() const { return state_.can_end; }
  // No byte can follow (the grammar is complete and admits nothing more, or input was rejected
  // by a caller that ignored a false return).
  bool exhausted() const { return state_.tops.empty(); }

  // Consumes `bytes` if the grammar allows all of them; otherwise returns false and leaves the
  // state as it was.
  bool accept(std::string_view bytes);

  // The state after consuming `byte` from `from`, frames pushed into this matcher's arena.
  // `out` is cleared first. Used by accept() and by the token-mask walk.
  void advance(const State& from, uint8_t byte, State& out);

  // Arena bookkeeping for speculative walks.
  size_t mark() const { return frames_.size(); }
  void rollback(size_t mark) { frames_.resize(mark); }
  // Drops frames no stack of the current state uses.
  void compact();

  // A state written out without the arena: each stack as (element << 32 | count) words, top
  // first; stacks sorted. Equal images are the same state (the same future).
  struct StateImage {
    std::vector<std::vector<uint64_t>> stacks;
    bool can_end = false;
    bool operator==(const StateImage&) const = default;
    uint64_t hash() const;
  };
  StateImage image_of(const State& state) const;
  // image_of(state).hash() and image_of(state) == image, without building the image (the
  // frames carry their stack's hash).
  uint64_t hash_of(const State& state) const;
  bool same_state(const State& state, const StateImage& image) const;
  StateImage image() const { return image_of(state_); }
  // Replaces the arena and the state with `image` (the inverse of image()).
  void load(const StateImage& image);
  // As load(), keeping only the stacks whose top accepts `byte`: advancing the result by `byte`
  // gives what advancing the whole image would, for a fraction of the frames when few stacks
  // accept the byte (can_end is dropped: advance() does not read it).
  void load_for_byte(const StateImage& image, uint8_t byte);

  const Grammar& grammar() const { return *grammar_; }

 private:
  struct Frame {
    uint32_t element;
    uint32_t count;
    int32_t parent;
    uint32_t depth;  // frames from the bottom of the stack, this one included
    uint64_t hash;
  };
  int32_t push(uint32_t element, uint32_t count, int32_t parent);
  // Expands the position `frame` until its tops are byte terminals, adding them to `out`.
  void expand(int32_t frame, State& out, int depth);
  // The position after `frame`'s element, returning to the parent at an alternative's end.
  void expand_next(int32_t frame, State& out, int depth);
  void dedupe(State& state) const;
  bool same_stack(int32_t a, int32_t b) const;

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Frame> frames_;
  State state_;
  State scratch_;
};

}  // namespace pagoda::grammar
