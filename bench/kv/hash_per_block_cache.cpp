#include "hash_per_block_cache.h"

#include "pagoda/kv/prefix_cache.h"

namespace pagoda::kv::bench {

HashPerBlockCache::HashPerBlockCache(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size), blocks_(static_cast<size_t>(num_blocks)) {
  for (int32_t b = 0; b < num_blocks; ++b) {
    blocks_[b].queue_position = free_queue_.insert(free_queue_.end(), b);
    blocks_[b].queued = true;
  }
}

int32_t HashPerBlockCache::take_block() {
  const int32_t b = free_queue_.front();
  free_queue_.pop_front();
  Block& block = blocks_[b];
  block.queued = false;
  if (block.hash != 0) {  // evict: its descendants (if any) stay cached but unreachable
    cached_.erase(block.hash);
    block.hash = 0;
  }
  block.ref = 1;
  return b;
}

int32_t HashPerBlockCache::allocate(int64_t seq, std::string_view tenant, std::span<const TokenId> prompt) {
  Sequence s;
  s.seed = namespace_seed(tenant);
  const int32_t max_blocks = static_cast<int32_t>((prompt.size() - 1) / static_cast<size_t>(block_size_));
  uint64_t h = s.seed;
  std::vector<int32_t> matched;
  for (int32_t i = 0; i < max_blocks; ++i) {
    h = chain_block_hash(h, prompt.data() + static_cast<size_t>(i) * block_size_, block_size_);
    const auto it = cached_.find(h);
    if (it == cached_.end()) break;
    matched.push_back(it->second);
    s.hashes.push_back(h);
  }
  const int32_t total = static_cast<int32_t>((prompt.size() + block_size_ - 1) / static_cast<size_t>(block_size_));
  int32_t matched_in_queue = 0;
  for (int32_t b : matched) matched_in_queue += blocks_[b].queued ? 1 : 0;
  if (total - static_cast<int32_t>(matched.size()) > static_cast<int32_t>(free_queue_.size()) - matched_in_queue)
    return -1;
  for (int32_t b : matched) {
    Block& block = blocks_[b];
    if (block.queued) {
      free_queue_.erase(block.queue_position);
      block.queued = false;
    }
    ++block.ref;
    s.blocks.push_back(b);
  }
  while (static_cast<int32_t>(s.blocks.size()) < total) s.blocks.push_back(take_block());
  s.tokens.assign(prompt.begin(), prompt.end());
  const int32_t cached = static_cast<int32_t>(matched.size()) * block_size_;
  hit_tokens_ += cached;
  prompt_tokens_ += static_cast<int64_t>(prompt.size());
  register_full_blocks(s);  // the prompt is prefilled in this simulation
  sequences_.emplace(seq, std::move(s));
  return cached;
}

void HashPerBlockCache::register_full_blocks(Sequence& s) {
  const size_t full = s.tokens.size() / static_cast<size_t>(block_size_);
  uint64_t h = s.hashes.empty() ? s.seed : s.hashes.back();
  for (size_t i = s.hashes.size(); i < full; ++i) {
    h = chain_block_hash(h, s.tokens.data() + i * static_cast<size_t>(block_size_), block_size_);
    s.hashes.push_back(h);
    Block& block = blocks_[s.blocks[i]];
    if (block.hash == 0 && cached_.emplace(h, s.blocks[i]).second) block.hash = h;
  }
}

bool HashPerBlockCache::extend(int64_t seq, std::span<const TokenId> tokens) {
  Sequence& s = sequences_.at(seq);
  const size_t new_size = s.tokens.size() + tokens.size();
  const size_t total = (new_size + block_size_ - 1) / static_cast<size_t>(block_size_);
  if (total - s.blocks.size() > free_queue_.size()) return false;
  while (s.blocks.size() < total) s.blocks.push_back(take_block());
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  register_full_blocks(s);
  return true;
}

void HashPerBlockCache::free(int64_t seq) {
  Sequence& s = sequences_.at(seq);
  // Tail first, so the end of a conversation is evicted before its start.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) {
    Block& block = blocks_[*it];
    if (--block.ref > 0) continue;
    if (block.hash == 0) {
      block.queue_position = free_queue_.insert(free_queue_.begin(), *it);  // uncached: reuse first
    } else {
      block.queue_position = free_queue_.insert(free_queue_.end(), *it);
    }
    block.queued = true;
  }
  sequences_.erase(seq);
}

}  // namespace pagoda::kv::bench
