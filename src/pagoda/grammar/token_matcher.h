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
// the first time they are needed and kept in a 256-entry table, so stepping a byte is a table
// lookup afterwards. A state's token mask is a depth-first walk of the vocabulary trie along
// those transitions (a subtree is dropped at its first dead byte); it is computed once per state
// and then copied. End-of-sequence ids are allowed exactly when the grammar is complete (and are
// the only ones when nothing may follow).
//
// Memory bounds: at most max_tables transition tables (1 KiB each) and max_cached_masks masks
// (mask_words() * 8 bytes each, oldest dropped first). When the tables run out they are all
// dropped and recomputed as needed, which only costs time; state ids stay valid (a state itself
// is its small stack image).
//
// Masks are little-endian bitsets: bit (id % 64) of word (id / 64); mask_words() words.
//
// Thread safety: CompiledGrammar is safe to share across threads (one mutex guards the automaton
// and the masks). A TokenMatcher belongs to one sequence; copies are independent.

#include <array>
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
  uint64_t misses = 0;              // masks computed by a trie walk
  uint64_t trie_nodes_visited = 0;  // over all misses
  uint64_t states = 0;              // automaton states interned
  uint64_t transitions_computed = 0;
};

class CompiledGrammar {
 public:
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                  size_t max_cached_masks = 128, size_t max_tables = 8192);

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  MaskStats stats() const;

 private:
  friend class TokenMatcher;
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kUnknown = -2;

  struct StateInfo {
    GrammarMatcher::StateImage image;
    bool has_tops = false;  // some byte may follow
    std::unique_ptr<std::array<int32_t, 256>> next;  // kUnknown until computed
    std::list<int32_t>::iterator mask_lru;            // valid when mask is not empty
    std::vector<uint64_t> mask;
  };

  // All under mutex_.
  int32_t initial_state_locked();
  int32_t intern_locked(GrammarMatcher::StateImage image);
  int32_t step_locked(int32_t state, uint8_t byte);
  void fill_mask_locked(int32_t state, std::span<uint64_t> mask);
  void walk_trie_locked(int32_t state, std::span<uint64_t> mask);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  const size_t max_cached_masks_;
  const size_t max_tables_;
  size_t tables_ = 0;
  mutable std::mutex mutex_;
  GrammarMatcher scratch_;  // materializes states to compute transitions
  std::vector<StateInfo> states_;
  std::unordered_multimap<uint64_t, int32_t> state_index_;
  std::list<int32_t> mask_lru_;  // states holding a mask, most recent first
  int32_t initial_ = -1;
  std::vector<int32_t> walk_states_;  // per trie depth during a walk
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
