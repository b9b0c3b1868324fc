#include "pagoda/grammar/token_matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace pagoda::grammar {

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const TokenVocabulary> vocabulary, size_t max_cached_masks,
                                 size_t max_tables)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      max_cached_masks_(max_cached_masks),
      max_tables_(std::max<size_t>(max_tables, 1)),
      scratch_(grammar_) {
  std::lock_guard lock(mutex_);
  initial_ = intern_locked(scratch_.image());
}

MaskStats CompiledGrammar::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

int32_t CompiledGrammar::intern_locked(GrammarMatcher::StateImage image) {
  const uint64_t hash = image.hash();
  auto [begin, end] = state_index_.equal_range(hash);
  for (auto it = begin; it != end; ++it)
    if (states_[it->second].image == image) return it->second;
  const int32_t id = static_cast<int32_t>(states_.size());
  StateInfo info;
  info.has_tops = !image.stacks.empty();
  info.image = std::move(image);
  states_.push_back(std::move(info));
  state_index_.emplace(hash, id);
  ++stats_.states;
  return id;
}

int32_t CompiledGrammar::step_locked(int32_t state, uint8_t byte) {
  if (!states_[state].has_tops) return kDead;
  if (!states_[state].next) {
    if (tables_ >= max_tables_) {
      for (StateInfo& s : states_) s.next.reset();
      tables_ = 0;
    }
    states_[state].next = std::make_unique<std::array<int32_t, 256>>();
    states_[state].next->fill(kUnknown);
    ++tables_;
  }
  const int32_t known = (*states_[state].next)[byte];
  if (known != kUnknown) return known;
  scratch_.load(states_[state].image);
  GrammarMatcher::State out;
  scratch_.advance(scratch_.state(), byte, out);
  const int32_t result = out.dead() ? kDead : intern_locked(scratch_.image_of(out));
  (*states_[state].next)[byte] = result;  // states_ may have grown: index again
  ++stats_.transitions_computed;
  return result;
}

void CompiledGrammar::walk_trie_locked(int32_t state, std::span<uint64_t> mask) {
  const TokenVocabulary& vocab = *vocabulary_;
  walk_states_.assign(static_cast<size_t>(vocab.max_depth()) + 1, kDead);
  walk_states_[0] = state;
  const size_t n = vocab.num_nodes();
  uint64_t visited = 0;
  for (size_t i = 0; i < n;) {
    ++visited;
    const size_t depth = vocab.node_depth(i);
    const int32_t next = step_locked(walk_states_[depth - 1], vocab.node_byte(i));
    if (next == kDead) {
      i = vocab.subtree_end(i);
      continue;
    }
    walk_states_[depth] = next;
    for (int32_t id : vocab.node_tokens(i)) mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    i = states_[next].has_tops ? i + 1 : vocab.subtree_end(i);
  }
  stats_.trie_nodes_visited += visited;
}

void CompiledGrammar::fill_mask_locked(int32_t state, std::span<uint64_t> mask) {
  const size_t words = vocabulary_->mask_words();
  if (!states_[state].mask.empty()) {
    std::memcpy(mask.data(), states_[state].mask.data(), words * sizeof(uint64_t));
    mask_lru_.splice(mask_lru_.begin(), mask_lru_, states_[state].mask_lru);
    ++stats_.hits;
    return;
  }
  ++stats_.misses;
  std::fill(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words), 0);
  walk_trie_locked(state, mask);
  if (states_[state].image.can_end) {
    for (int32_t id : vocabulary_->end_ids()) mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  }
  if (max_cached_masks_ == 0) return;
  StateInfo& info = states_[state];
  info.mask.assign(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words));
  mask_lru_.push_front(state);
  info.mask_lru = mask_lru_.begin();
  while (mask_lru_.size() > max_cached_masks_) {
    StateInfo& old = states_[mask_lru_.back()];
    old.mask.clear();
    old.mask.shrink_to_fit();
    mask_lru_.pop_back();
  }
}

TokenMatcher::TokenMatcher(std::shared_ptr<CompiledGrammar> compiled) : compiled_(std::move(compiled)) {
  std::lock_guard lock(compiled_->mutex_);
  state_ = compiled_->initial_;
}

size_t TokenMatcher::fill_mask(std::span<uint64_t> mask) {
  const size_t words = mask_words();
  if (mask.size() < words) return 0;
  std::fill(mask.begin() + static_cast<std::ptrdiff_t>(words), mask.end(), 0);
  if (finished_) {
    std::fill(mask.begin(), mask.end(), 0);
    for (int32_t id : compiled_->vocabulary().end_ids()) mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  } else {
    std::lock_guard lock(compiled_->mutex_);
    compiled_->fill_mask_locked(state_, mask);
  }
  size_t allowed = 0;
  for (size_t w = 0; w < words; ++w) allowed += static_cast<size_t>(std::popcount(mask[w]));
  return allowed;
}

bool TokenMatcher::accept(int32_t token) {
  const TokenVocabulary& vocab = compiled_->vocabulary();
  if (token < 0 || token >= vocab.size()) return false;
  if (finished_) return vocab.is_end(token);  // ignore_eos requests go on emitting end ids
  if (vocab.is_end(token)) {
    if (!is_complete()) return false;
    finished_ = true;
    return true;
  }
  const std::string_view bytes = vocab.bytes(token);
  if (bytes.empty()) return false;
  return accept_text(bytes);
}

bool TokenMatcher::accept_text(std::string_view bytes) {
  if (finished_) return false;
  std::lock_guard lock(compiled_->mutex_);
  int32_t s = state_;
  for (char c : bytes) {
    s = compiled_->step_locked(s, static_cast<uint8_t>(c));
    if (s == CompiledGrammar::kDead) return false;
  }
  state_ = s;
  return true;
}

bool TokenMatcher::is_complete() const {
  std::lock_guard lock(compiled_->mutex_);
  return compiled_->states_[state_].image.can_end;
}

}  // namespace pagoda::grammar
