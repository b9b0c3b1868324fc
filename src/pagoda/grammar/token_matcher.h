#pragma once
// Grammar-constrained decoding over a tokenizer's vocabulary.
//
//   CompiledGrammar   a grammar bound to a TokenVocabulary, plus the cache of token masks shared
//                     by every sequence that uses it (one per distinct request grammar; the
//                     server keeps recently used ones, see grammar_cache.h).
//   TokenMatcher      one sequence's position in it: fill_mask() sets the bit of every token
//                     that may come next, accept() moves past the sampled token.
//
// How a mask is made: the matcher's state (its set of stacks) is looked up in the cache; a miss
// walks the vocabulary trie depth first, advancing a copy of the state byte by byte and dropping a
// subtree at the first byte no stack accepts, then stores the mask. The cache key is the exact
// state, so states that recur -- inside a JSON string, between fields, in every request with the
// same schema -- cost a copy of the cached mask. End-of-sequence ids are allowed exactly when the
// grammar is complete (and then, when nothing may follow, they are the only ones).
//
// Masks are little-endian bitsets: bit (id % 64) of word (id / 64); mask_words() words.
//
// Thread safety: CompiledGrammar is safe to share across threads (its cache takes a mutex).
// A TokenMatcher belongs to one sequence and is not safe for concurrent use.

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
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t trie_nodes_visited = 0;  // over all misses
};

class CompiledGrammar {
 public:
  // `max_cached_masks`: masks kept (each is mask_words() * 8 bytes); the oldest go first.
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
                  size_t max_cached_masks = 512);

  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  MaskStats stats() const;

 private:
  friend class TokenMatcher;
  struct CachedMask {
    std::vector<GrammarMatcher::StackImage> image;
    std::vector<uint64_t> mask;
  };
  // Copies the cached mask for the matcher's state into `out`; false on a miss.
  bool lookup(const GrammarMatcher& matcher, uint64_t hash, std::span<uint64_t> out);
  void store(const GrammarMatcher& matcher, uint64_t hash, std::span<const uint64_t> mask);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  const size_t max_cached_masks_;
  mutable std::mutex mutex_;
  std::unordered_multimap<uint64_t, std::list<CachedMask>::iterator> index_;
  std::list<CachedMask> entries_;  // newest first
  MaskStats stats_;
};

class TokenMatcher {
 public:
  explicit TokenMatcher(std::shared_ptr<CompiledGrammar> compiled);
  TokenMatcher(const TokenMatcher&) = default;

  // Sets exactly the allowed tokens' bits; `mask` has at least mask_words() words (extra words
  // are cleared). Returns the number of allowed tokens.
  size_t fill_mask(std::span<uint64_t> mask);
  // Moves past `token`. False when the grammar does not allow it (the state is unchanged).
  // An end id is allowed when the grammar is complete; after it the matcher is finished.
  bool accept(int32_t token);
  // Moves past raw text (e.g. a forced prefix); false when not allowed (state unchanged).
  bool accept_text(std::string_view bytes);

  bool is_complete() const { return matcher_.can_end(); }  // an end id is allowed now
  bool is_finished() const { return finished_; }           // an end id was accepted
  size_t mask_words() const { return compiled_->vocabulary().mask_words(); }
  const CompiledGrammar& compiled() const { return *compiled_; }

 private:
  void walk_trie(std::span<uint64_t> mask, uint64_t& nodes_visited);

  std::shared_ptr<CompiledGrammar> compiled_;
  GrammarMatcher matcher_;
  bool finished_ = false;
  // Per-depth states of the trie walk (reused across calls).
  std::vector<GrammarMatcher::State> levels_;
  std::vector<size_t> level_marks_;
};

}  // namespace pagoda::grammar
