#include "naive_kv_model.h"

#include <algorithm>
#include <cassert>
#include <set>

namespace pagoda::kv::testing {

NaiveKvModel::NaiveKvModel(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), bs_(block_size) {}

NaiveKvModel::Key NaiveKvModel::key_of(const std::string& ns, const std::vector<TokenId>& tokens,
                                       int32_t num_blocks) const {
  return Key{ns, std::vector<TokenId>(tokens.begin(), tokens.begin() + static_cast<int64_t>(num_blocks) * bs_)};
}

int32_t NaiveKvModel::matched_blocks(const std::string& ns, const std::vector<TokenId>& tokens,
                                     int32_t max_blocks) const {
  int32_t i = 0;
  while (i < max_blocks && cached_.count(key_of(ns, tokens, i + 1)) != 0) ++i;
  return i;
}

PrefixMatch NaiveKvModel::match(const std::string& ns, const std::vector<TokenId>& prompt) const {
  PrefixMatch m;
  const int32_t max_blocks = static_cast<int32_t>((static_cast<int64_t>(prompt.size()) - 1) / bs_);
  if (max_blocks <= 0) {
    m.reason = MissReason::kShorterThanBlock;
    return m;
  }
  const int32_t matched = matched_blocks(ns, prompt, max_blocks);
  m.cached_tokens = matched * bs_;
  if (matched == max_blocks) {
    m.reason = MissReason::kHit;
    return m;
  }
  const Key miss = key_of(ns, prompt, matched + 1);
  if (removed_.count(miss) != 0) {
    m.reason = MissReason::kEvicted;
    return m;
  }
  for (const auto& [key, block] : cached_) {
    if (key.second == miss.second) {
      m.reason = MissReason::kOtherNamespace;
      return m;
    }
  }
  m.reason = MissReason::kNeverSeen;
  return m;
}

int32_t NaiveKvModel::available() const {
  int32_t evictable = 0;
  for (const auto& [key, b] : cached_) evictable += blocks_[b].ref == 0 ? 1 : 0;
  return num_free() + evictable;
}

int32_t NaiveKvModel::num_in_use() const {
  int32_t n = 0;
  for (const Block& b : blocks_) n += b.live && b.ref > 0 ? 1 : 0;
  return n;
}

int64_t NaiveKvModel::unwritten_slots() const {
  int64_t n = 0;
  for (const Block& b : blocks_) n += b.live && b.ref > 0 ? bs_ - b.written : 0;
  return n;
}

std::vector<int64_t> NaiveKvModel::sequence_ids() const {
  std::vector<int64_t> ids;
  for (const auto& [id, s] : sequences_) ids.push_back(id);
  return ids;
}

bool NaiveKvModel::is_leaf(const Key& key) const {
  // Extensions of a key sort right after it; every cached key's ancestors are cached.
  auto it = cached_.upper_bound(key);
  if (it == cached_.end() || it->first.first != key.first) return true;
  const auto& next = it->first.second;
  return !(next.size() > key.second.size() && std::equal(key.second.begin(), key.second.end(), next.begin()));
}

void NaiveKvModel::uncache(int32_t b, RemovalReason reason) {
  Block& block = blocks_[b];
  cached_.erase(block.key);
  removed_.insert(block.key);
  block.cached = false;
  ++removed_by_reason[static_cast<int>(reason)];
  if (block.ref == 0) {
    block.live = false;
    --live_blocks_;
    dead_ids_.push_back(b);
  }
}

bool NaiveKvModel::evict_one() {
  int32_t victim = -1;
  for (const auto& [key, b] : cached_) {
    if (blocks_[b].ref != 0 || !is_leaf(key)) continue;
    if (victim < 0 || blocks_[b].last_access < blocks_[victim].last_access) victim = b;
  }
  if (victim < 0) return false;
  uncache(victim, RemovalReason::kEvictedForSpace);
  return true;
}

int32_t NaiveKvModel::new_block() {
  if (num_free() == 0) {
    const bool evicted = evict_one();
    assert(evicted);
    (void)evicted;
  }
  int32_t id;
  if (!dead_ids_.empty()) {
    id = dead_ids_.back();
    dead_ids_.pop_back();
  } else {
    id = static_cast<int32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  blocks_[id] = Block{};
  blocks_[id].live = true;
  blocks_[id].ref = 1;
  ++live_blocks_;
  return id;
}

void NaiveKvModel::acquire(int32_t b) { ++blocks_[b].ref; }

void NaiveKvModel::release_block(int32_t b) {
  Block& block = blocks_[b];
  if (--block.ref > 0) return;
  if (block.cached) {
    block.last_access = now_;
  } else {
    block.live = false;
    --live_blocks_;
    dead_ids_.push_back(b);
  }
}

bool NaiveKvModel::can_allocate_sequence(const std::string& ns, const std::vector<TokenId>& prompt) const {
  const PrefixMatch m = match(ns, prompt);
  const int32_t matched = m.cached_tokens / bs_;
  int32_t matched_unreferenced = 0;
  for (int32_t i = 1; i <= matched; ++i) matched_unreferenced += blocks_[cached_.at(key_of(ns, prompt, i))].ref == 0;
  return blocks_for(static_cast<int64_t>(prompt.size())) - matched <= available() - matched_unreferenced;
}

bool NaiveKvModel::allocate(int64_t id, const std::string& ns, const std::vector<TokenId>& prompt) {
  if (!can_allocate_sequence(ns, prompt)) {
    ++allocation_failures;
    return false;
  }
  const PrefixMatch m = match(ns, prompt);
  const int32_t matched = m.cached_tokens / bs_;
  Sequence s;
  s.ns = ns;
  s.tokens = prompt;
  for (int32_t i = 1; i <= matched; ++i) {
    const int32_t b = cached_.at(key_of(ns, prompt, i));
    acquire(b);
    blocks_[b].last_access = now_;
    s.blocks.push_back(b);
  }
  while (static_cast<int32_t>(s.blocks.size()) < blocks_for(static_cast<int64_t>(prompt.size())))
    s.blocks.push_back(new_block());
  s.computed = m.cached_tokens;
  s.next_to_cache = matched;
  s.chain.assign(s.blocks.begin(), s.blocks.begin() + matched);
  sequences_[id] = std::move(s);
  const int64_t size = static_cast<int64_t>(prompt.size());
  const int64_t max_blocks = (size - 1) / bs_;
  hit_tokens += m.cached_tokens;
  miss_tokens += size - m.cached_tokens;
  miss_by_reason[static_cast<int>(MissReason::kShorterThanBlock)] += size - max_blocks * bs_;
  if (max_blocks * bs_ > m.cached_tokens) miss_by_reason[static_cast<int>(m.reason)] += max_blocks * bs_ - m.cached_tokens;
  return true;
}

bool NaiveKvModel::append(int64_t id, const std::vector<TokenId>& tokens) {
  Sequence& s = sequences_.at(id);
  const int32_t needed = blocks_for(static_cast<int64_t>(s.tokens.size() + tokens.size())) -
                         static_cast<int32_t>(s.blocks.size());
  if (needed > available()) {
    ++allocation_failures;
    return false;
  }
  for (int32_t i = 0; i < needed; ++i) s.blocks.push_back(new_block());
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  return true;
}

void NaiveKvModel::mark_computed(int64_t id, int64_t n) {
  Sequence& s = sequences_.at(id);
  s.computed += n;
  for (size_t j = 0; j < s.blocks.size(); ++j)
    blocks_[s.blocks[j]].written =
        static_cast<int32_t>(std::clamp<int64_t>(s.computed - static_cast<int64_t>(j) * bs_, 0, bs_));
  const int32_t full = static_cast<int32_t>(s.computed / bs_);
  for (; s.next_to_cache < full; ++s.next_to_cache) {
    const int32_t j = s.next_to_cache;
    s.chain.push_back(s.blocks[j]);
    if (j > 0 && !blocks_[s.chain[j - 1]].cached) continue;
    Key key = key_of(s.ns, s.tokens, j + 1);
    const auto it = cached_.find(key);
    if (it != cached_.end()) {
      acquire(it->second);
      blocks_[it->second].last_access = now_;
      s.chain[j] = it->second;
      ++blocks_deduplicated;
    } else {
      Block& b = blocks_[s.blocks[j]];
      b.cached = true;
      b.key = key;
      b.last_access = now_;
      cached_.emplace(std::move(key), s.blocks[j]);
      ++blocks_stored;
    }
  }
}

std::optional<int32_t> NaiveKvModel::fork(int64_t parent_id, int64_t child_id) {
  const Sequence parent = sequences_.at(parent_id);
  const int32_t shared = static_cast<int32_t>(parent.computed / bs_);
  const int32_t needed = static_cast<int32_t>(parent.blocks.size()) - shared;
  if (needed > available()) {
    ++allocation_failures;
    return std::nullopt;
  }
  Sequence child = parent;
  for (size_t j = 0; j < parent.chain.size(); ++j)
    if (parent.chain[j] != parent.blocks[j]) acquire(parent.chain[j]);
  int32_t copies = 0;
  for (int32_t j = 0; j < static_cast<int32_t>(parent.blocks.size()); ++j) {
    if (j < shared) {
      acquire(parent.blocks[j]);
    } else {
      child.blocks[j] = new_block();
      blocks_[child.blocks[j]].written = blocks_[parent.blocks[j]].written;
      copies += blocks_[parent.blocks[j]].written > 0 ? 1 : 0;
    }
  }
  sequences_[child_id] = std::move(child);
  return copies;
}

void NaiveKvModel::release(int64_t id) {
  const Sequence s = sequences_.at(id);
  sequences_.erase(id);
  for (size_t j = s.blocks.size(); j-- > 0;) {
    release_block(s.blocks[j]);
    if (j < s.chain.size() && s.chain[j] != s.blocks[j]) release_block(s.chain[j]);
  }
}

int32_t NaiveKvModel::drop_namespace(const std::string& ns) {
  std::vector<int32_t> victims;
  for (const auto& [key, b] : cached_)
    if (key.first == ns) victims.push_back(b);
  for (int32_t b : victims) uncache(b, RemovalReason::kDroppedNamespace);
  return static_cast<int32_t>(victims.size());
}

int32_t NaiveKvModel::drop_conversation(const std::string& ns, const std::vector<TokenId>& tokens, int64_t keep) {
  const int32_t full = static_cast<int32_t>(tokens.size() / static_cast<size_t>(bs_));
  const int32_t matched = matched_blocks(ns, tokens, full);
  const int32_t start = static_cast<int32_t>(keep / bs_);
  if (matched <= start) return 0;
  const Key root = key_of(ns, tokens, start + 1);
  std::vector<int32_t> victims;
  for (const auto& [key, b] : cached_) {
    if (key.first == ns && key.second.size() >= root.second.size() &&
        std::equal(root.second.begin(), root.second.end(), key.second.begin()))
      victims.push_back(b);
  }
  for (int32_t b : victims) uncache(b, RemovalReason::kDroppedConversation);
  return static_cast<int32_t>(victims.size());
}

int32_t NaiveKvModel::evict(int32_t n) {
  int32_t evicted = 0;
  while (evicted < n && evict_one()) ++evicted;
  return evicted;
}

int32_t NaiveKvModel::available_after_release(const std::vector<int64_t>& ids) const {
  std::set<int64_t> unique(ids.begin(), ids.end());
  std::map<int32_t, int32_t> drops;
  for (int64_t id : unique) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) continue;
    const Sequence& s = it->second;
    for (size_t j = 0; j < s.blocks.size(); ++j) {
      ++drops[s.blocks[j]];
      if (j < s.chain.size() && s.chain[j] != s.blocks[j]) ++drops[s.chain[j]];
    }
  }
  int32_t gained = 0;
  for (const auto& [b, count] : drops) gained += blocks_[b].ref == count ? 1 : 0;
  return available() + gained;
}

}  // namespace pagoda::kv::testing
