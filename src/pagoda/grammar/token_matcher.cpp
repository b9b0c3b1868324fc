#include "pagoda/grammar/token_matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace pagoda::grammar {

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const TokenVocabulary> vocabulary, size_t max_cached_masks)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)), max_cached_masks_(max_cached_masks) {}

MaskStats CompiledGrammar::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

bool CompiledGrammar::lookup(const GrammarMatcher& matcher, uint64_t hash, std::span<uint64_t> out) {
  std::lock_guard lock(mutex_);
  auto [begin, end] = index_.equal_range(hash);
  if (begin == end) {
    ++stats_.misses;
    return false;
  }
  const auto image = matcher.state_image();
  for (auto it = begin; it != end; ++it) {
    if (it->second->image != image) continue;
    const std::vector<uint64_t>& mask = it->second->mask;
    std::memcpy(out.data(), mask.data(), mask.size() * sizeof(uint64_t));
    entries_.splice(entries_.begin(), entries_, it->second);  // most recently used first
    ++stats_.hits;
    return true;
  }
  ++stats_.misses;
  return false;
}

void CompiledGrammar::store(const GrammarMatcher& matcher, uint64_t hash, std::span<const uint64_t> mask) {
  if (max_cached_masks_ == 0) return;
  CachedMask entry{matcher.state_image(), std::vector<uint64_t>(mask.begin(), mask.end())};
  std::lock_guard lock(mutex_);
  entries_.push_front(std::move(entry));
  index_.emplace(hash, entries_.begin());
  while (entries_.size() > max_cached_masks_) {
    auto last = std::prev(entries_.end());
    for (auto it = index_.begin(); it != index_.end(); ++it) {
      if (it->second == last) {
        index_.erase(it);
        break;
      }
    }
    entries_.pop_back();
  }
}

TokenMatcher::TokenMatcher(std::shared_ptr<CompiledGrammar> compiled)
    : compiled_(std::move(compiled)), matcher_(compiled_->grammar_ptr()) {}

void TokenMatcher::walk_trie(std::span<uint64_t> mask, uint64_t& nodes_visited) {
  const TokenVocabulary& vocab = compiled_->vocabulary();
  const size_t depths = static_cast<size_t>(vocab.max_depth()) + 1;
  if (levels_.size() < depths) levels_.resize(depths);
  if (level_marks_.size() < depths) level_marks_.resize(depths);
  levels_[0] = matcher_.state();
  const size_t base = matcher_.mark();
  level_marks_[0] = base;
  const size_t n = vocab.num_nodes();
  for (size_t i = 0; i < n;) {
    ++nodes_visited;
    const size_t depth = vocab.node_depth(i);
    matcher_.rollback(level_marks_[depth - 1]);
    GrammarMatcher::State& state = levels_[depth];
    matcher_.advance(levels_[depth - 1], vocab.node_byte(i), state);
    level_marks_[depth] = matcher_.mark();
    if (!state.dead()) {
      for (int32_t id : vocab.node_tokens(i)) mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    i = state.tops.empty() ? vocab.subtree_end(i) : i + 1;
  }
  matcher_.rollback(base);
}

size_t TokenMatcher::fill_mask(std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  const size_t words = mask_words();
  if (mask.size() < words) return 0;
  if (finished_) {
    for (int32_t id : compiled_->vocabulary().end_ids()) mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  } else {
    const uint64_t hash = matcher_.state_hash();
    if (!compiled_->lookup(matcher_, hash, mask.first(words))) {
      uint64_t visited = 0;
      walk_trie(mask, visited);
      if (matcher_.can_end()) {
        for (int32_t id : compiled_->vocabulary().end_ids())
          mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      }
      compiled_->store(matcher_, hash, mask.first(words));
      std::lock_guard lock(compiled_->mutex_);
      compiled_->stats_.trie_nodes_visited += visited;
    }
  }
  size_t allowed = 0;
  for (size_t w = 0; w < words; ++w) allowed += static_cast<size_t>(std::popcount(mask[w]));
  return allowed;
}

bool TokenMatcher::accept(int32_t token) {
  const TokenVocabulary& vocab = compiled_->vocabulary();
  if (finished_ || token < 0 || token >= vocab.size()) return false;
  if (vocab.is_end(token)) {
    if (!matcher_.can_end()) return false;
    finished_ = true;
    return true;
  }
  const std::string_view bytes = vocab.bytes(token);
  if (bytes.empty() || !matcher_.accept(bytes)) return false;
  matcher_.compact();
  return true;
}

bool TokenMatcher::accept_text(std::string_view bytes) {
  if (finished_ || !matcher_.accept(bytes)) return false;
  matcher_.compact();
  return true;
}

}  // namespace pagoda::grammar
