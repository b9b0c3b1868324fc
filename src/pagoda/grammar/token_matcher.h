#pragma once
// Grammar-constrained decoding over a tokenizer's vocabulary.
//
//   CompiledGrammar   a grammar bound to a TokenVocabulary (one per distinct request grammar;
//                     the server keeps recent ones, see server/structured_output.h). It owns a
//                     lazily built automaton over the grammar's matcher states and the masks of
//                     the states seen so far, shared by every sequence that uses the grammar.
//   TokenMatcher      one sequence's position: a state of that automaton. fill_mask() sets the
//                     bit of every token that may come next; accept() moves past a token.
//
// The automaton: a state is one set of pushdown stacks (GrammarMatcher::StateImage), interned
// by content, so equal configurations -- inside a JSON string, between fields, in every request
// with the same schema -- are one state. Its byte transitions are computed by the pushdown matcher
// the first time they are needed and kept in a table with an entry per byte class, so stepping
// a byte is a table lookup afterwards. A state's token mask is a depth-first walk of the vocabulary trie along
// those transitions (a subtree is dropped at its first dead byte); it is computed once per state
// and then copied. End-of-sequence ids are allowed exactly when the grammar is complete (and are
// the only ones when nothing may follow).
//
// Masks by parts (what makes a state's first mask cheap). A state is a set of stacks, and most
// of a token is decided by the top few frames of a stack: the "window" of the stack's top K
// frames (K = 4, 8, 16, then the whole stack). Walking the trie from the window alone, with the
// frames below it cut off, splits the vocabulary three ways: tokens the window accepts on its
// own (accepted whatever lies below), tokens it rejects before ever returning below its bottom
// frame (rejected whatever lies below), and tokens that return below the window part-way
// through ("uncertain": they depend on the rest of the stack). A window's accepted bits and
// uncertain ids are kept (keyed by the window's frames), so many states share them: the inside
// of a JSON string at any depth, every value position of the same type. A state's mask is then
// the union of its stacks' accepted bits plus the uncertain tokens it accepts, checked one by
// one along the state's byte transitions. A window with more than max_uncertain uncertain
// tokens is tried again with the next K. The whole-trie walk remains the fallback when the
// window cache is full. A path that returns below the window continues, in whatever context,
// with a byte that may follow the returning rule somewhere in the grammar (the rule's FOLLOW
// set, computed once per grammar): a token whose next byte is in no such set is rejected by the
// window, not left uncertain (inside a JSON string, of the tokens that close it only those going
// on with blanks, ',', ':', '}' or ']' stay uncertain). The union of a window set's accepted
// tokens is kept when it costs several mask ORs (a JSON value position: a dozen stacks; the same
// windows recur at every depth), at most max_window_unions of them, filled by precompute() too.
//
// precompute() fills the window cache ahead of the first request: a breadth-first walk over
// the automaton's states (byte by byte from the start) that computes every window it meets,
// within a budget of states and 70% of its time. A bounded repetition gives each count its own
// frames (json_object's indentation: a newline and up to 20 blanks), which would spend an
// unbounded grammar's budget on blanks: states past a repetition's second round are walked
// last, and the windows of every other count are computed from the stacks the walk met (the
// same frames, the count replaced), in the rest of the time. The server runs it when it
// compiles a grammar, on the request's thread (json_object: at start, on a background thread).
//
// Memory bounds: at most max_tables transition tables (4 bytes per byte class each: bytes that
// no byte set of the grammar tells apart share an entry; tens of classes for JSON), max_cached_masks masks
// (mask_words() * 8 bytes each, oldest dropped first) and max_windows windows holding at most
// max_window_bytes together (a mask or a list of ids, plus at most max_uncertain ids each; none
// added when full), max_window_unions unions (a mask each; none added when full). When the
// tables run out they are all
// dropped and recomputed as needed, which only costs time; state ids stay valid (a state itself
// is its small stack image).
//
// Masks are little-endian bitsets: bit (id % 64) of word (id / 64); mask_words() words.
//
// Thread safety: CompiledGrammar is safe to share across threads (one mutex guards the automaton
// and the masks). A TokenMatcher belongs to one sequence; copies are independent.

#include <array>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagoda/grammar/grammar.h"
#include "pagoda/grammar/grammar_matcher.h"
#include "pagoda/grammar/token_vocabulary.h"

namespace pagoda::grammar {

struct MaskStats {
  uint64_t hits = 0;                // masks copied from the cache
  uint64_t misses = 0;              // masks computed (by parts or by a whole-trie walk)
  uint64_t whole_walks = 0;         // misses that walked the whole trie (window cache full)
  uint64_t trie_nodes_visited = 0;  // over all trie walks (windows and whole)
  uint64_t states = 0;              // automaton states interned
  uint64_t transitions_computed = 0;
  uint64_t windows = 0;             // windows computed
  uint64_t window_bytes = 0;        // memory the windows hold
  uint64_t uncertain_checked = 0;   // uncertain tokens checked against a state
  uint64_t stacks_composed = 0;     // stacks whose windows made up composed masks
  uint64_t union_hits = 0;          // composed masks that copied a kept union of accepted tokens
};

// precompute()'s budget. On a request's thread (a new schema): a bound on the request's wait. At
// server start (json_object, the same for every request, compiled on a background thread): off
// every request's path, so bounded by states and not by how loaded the machine is (the same
// states take 0.1-0.2 s on a quiet core and over 1 s on a loaded one).
struct PrecomputeBudget {
  size_t states;
  double seconds;
};
inline constexpr PrecomputeBudget kRequestPrecompute{4096, 0.5};
inline constexpr PrecomputeBudget kStartupPrecompute{4096, 5.0};

struct PrecomputeStats {
  uint64_t states = 0;   // automaton states visited
  uint64_t windows = 0;  // windows computed
  uint64_t count_siblings = 0;  // stacks whose windows were computed for every repetition count
  bool complete = false;  // every reachable state was visited within the budget
  double seconds = 0;
};

class CompiledGrammar {
 public:
  struct Limits {
    size_t max_cached_masks = 128;
    size_t max_tables = 32768;
    size_t max_windows = 4096;
    size_t max_window_bytes = size_t{8} << 20;  // all windows together
    size_t max_uncertain = 1024;
    size_t max_window_unions = 128;  // kept unions of a window set's accepted tokens (a mask each)
  };
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                  Limits limits);
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
      : CompiledGrammar(std::move(grammar), std::move(vocabulary), Limits{}) {}

  // Computes the windows of the states reachable from the start, breadth first, until every
  // reachable state is visited, `max_states` are, or `max_seconds` have passed.
  PrecomputeStats precompute(size_t max_states, double max_seconds);

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  MaskStats stats() const;
  // Bytes this grammar holds now (states, transition tables, cached masks, windows; the grammar
  // and the vocabulary, shared, not counted). Grows as sequences meet new states, within Limits.
  size_t memory_bytes() const;

 private:
  friend class TokenMatcher;
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kUnknown = -2;

  struct StateInfo {
    GrammarMatcher::StateImage image;
    bool has_tops = false;  // some byte may follow
    std::unique_ptr<int32_t[]> next;  // per byte class; kUnknown until computed
    std::list<int32_t>::iterator mask_lru;            // valid when mask is not empty
    std::vector<uint64_t> mask;
    int16_t forced = -2;  // the only byte that may follow (-1: none or several; -2: not known yet)
  };

  // A window's verdicts (see the file comment).
  struct Window {
    std::vector<uint64_t> frames;  // the window's stack words, top first
    bool cut = false;              // frames lay below it (part of a longer stack)
    // The accepted tokens: mask words when many, else their ids (most windows are inside
    // literals and accept a handful of tokens).
    std::vector<uint64_t> accepted_bits;
    std::vector<int32_t> accepted_ids;
    std::vector<int32_t> uncertain;  // ids in trie order (sorted by bytes)
    bool too_uncertain = false;      // more than max_uncertain: use the next window size
    size_t bytes() const {
      return (accepted_bits.capacity() + frames.capacity()) * 8 + (accepted_ids.capacity() + uncertain.capacity()) * 4;
    }
  };

  // The union of a window set's accepted tokens (the set sorted, each window once).
  struct WindowUnion {
    std::vector<const Window*> windows;
    std::vector<uint64_t> bits;
  };

  // All under mutex_.
  // Writes the union of `windows`' accepted tokens into `mask` (every word), copied from unions_
  // when the set is kept there; a costly one is kept while there is room.
  void accepted_union_locked(const std::vector<const Window*>& windows, std::span<uint64_t> mask);
  int32_t intern_locked(GrammarMatcher::StateImage image);
  int32_t step_locked(int32_t state, uint8_t byte);
  void fill_mask_locked(int32_t state, std::span<uint64_t> mask);
  void walk_trie_locked(int32_t state, std::span<uint64_t> mask);
  // The mask of `state` from its stacks' windows; false (mask undefined) when a window is
  // missing and the window cache is full.
  bool compose_mask_locked(int32_t state, std::span<uint64_t> mask);
  // The window that decides `stack` (top frame first), computed if missing; null when the
  // window cache is full.
  const Window* window_for_locked(const std::vector<uint64_t>& stack);
  void compute_window_locked(int32_t local_state, bool cut, Window& window);
  // The only byte that may follow `state` when exactly one may and the grammar cannot end there,
  // else -1.
  int forced_byte_locked(int32_t state);
  // Some stack of `state` is past the second round of a bounded repetition within its top frames
  // (precompute() covers those counts from the first round's stacks).
  bool repeats_again_locked(int32_t state) const;
  // Sets the bits of the ids in `ids` (trie order) that `state` accepts.
  void check_uncertain_locked(int32_t state, const std::vector<int32_t>& ids, std::span<uint64_t> mask);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  const Limits limits_;
  size_t tables_ = 0;
  size_t state_bytes_ = 0;  // states_ and state_index_
  // Bytes no byte set of the grammar tells apart share a class (every step depends on a byte
  // only through the sets it is in): a table has one entry per class, and precompute() steps
  // one representative byte per class.
  std::array<uint8_t, 256> byte_class_{};
  std::vector<uint8_t> class_byte_;
  mutable std::mutex mutex_;
  GrammarMatcher scratch_;  // materializes states to compute transitions
  int32_t loaded_state_ = -1;  // the state scratch_ holds (its frames below loaded_mark_)
  size_t loaded_mark_ = 0;
  bool load_whole_states_ = false;  // precompute(): keep a loaded state for its next byte classes
  GrammarMatcher::State step_out_;
  // Reserved ahead by precompute(): growing copies every state, a latency spike in the mask that
  // happens to intern the next state (a deque avoids it but slows the trie walks' lookups).
  std::vector<StateInfo> states_;
  std::unordered_multimap<uint64_t, int32_t> state_index_;
  std::list<int32_t> mask_lru_;  // states holding a mask, most recent first
  int32_t initial_ = -1;
  std::vector<int32_t> walk_states_;  // per trie depth during a walk
  std::vector<char> walk_escaped_;    // per trie depth: a path returned below the window, alive past its next byte
  std::vector<char> walk_fresh_;      // per trie depth: a path returned below the window here
  // Per rule: the bytes that may follow it anywhere in the grammar; the rule of each element.
  std::vector<ByteSet> follow_;
  std::vector<uint32_t> rule_of_element_;
  std::vector<uint64_t> window_scratch_;
  std::vector<const Window*> compose_windows_;
  std::vector<const Window*> union_key_;
  std::vector<uint64_t> union_scratch_;
  std::unordered_multimap<uint64_t, WindowUnion> unions_;  // by a hash of the sorted window pointers
  // Windows by a hash of their frames and cut flag (found without interning the window's
  // frames as a state: a lookup per stack of every composed mask).
  std::unordered_multimap<uint64_t, Window> windows_;
  size_t window_bytes_ = 0;
  MaskStats stats_;
};

class TokenMatcher {
 public:
  explicit TokenMatcher(std::shared_ptr<CompiledGrammar> compiled);

  // Sets exactly the allowed tokens' bits; `mask` must have at least mask_words() words (extra
  // words are cleared). Returns the number of allowed tokens.
  size_t fill_mask(std::span<uint64_t> mask);
  // Moves past `token`. False when the grammar does not allow it (the state is unchanged).
  // An end id is allowed when the grammar is complete; after it the matcher is finished and
  // allows end ids only (a request with ignore_eos keeps sampling them).
  bool accept(int32_t token);
  // Moves past raw text (e.g. a forced prefix); false when not allowed (state unchanged).
  bool accept_text(std::string_view bytes);
  // The text the grammar forces from here (each byte the only one allowed, the grammar not
  // complete before it), at most `max_bytes`; empty when the next byte is a choice. For
  // jump-forward: that text follows whatever the model samples. The state is unchanged.
  std::string forced_text(size_t max_bytes) const;

  bool is_complete() const;                        // an end id is allowed now
  bool is_finished() const { return finished_; }   // an end id was accepted
  size_t mask_words() const { return compiled_->vocabulary().mask_words(); }
  const CompiledGrammar& compiled() const { return *compiled_; }

 private:
  std::shared_ptr<CompiledGrammar> compiled_;
  int32_t state_ = -1;
  bool finished_ = false;
};

}  // namespace pagoda::grammar
