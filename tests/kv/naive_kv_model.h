#pragma once
// NaiveKvModel: the KV cache manager's contract written as plainly as possible
// (maps keyed by whole token prefixes, linear scans), for the property test to
// compare KvCacheManager against. It mirrors LRU eviction only. Its block
// identities are its own; only counts, match lengths, reasons and sharing
// patterns are compared.

#include <cstdint>
#include <set>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/kv/kv_types.h"

namespace pagoda::kv::testing {

class NaiveKvModel {
 public:
  NaiveKvModel(int32_t num_blocks, int32_t block_size);

  void set_time(uint64_t now) { now_ = now; }

  PrefixMatch match(const std::string& ns, const std::vector<TokenId>& prompt) const;  // blocks left empty
  bool can_allocate_sequence(const std::string& ns, const std::vector<TokenId>& prompt) const;
  bool allocate(int64_t id, const std::string& ns, const std::vector<TokenId>& prompt);
  bool append(int64_t id, const std::vector<TokenId>& tokens);
  void mark_computed(int64_t id, int64_t n);
  // Number of block copies; nullopt when out of blocks.
  std::optional<int32_t> fork(int64_t parent, int64_t child);
  void release(int64_t id);
  int32_t drop_namespace(const std::string& ns);
  int32_t drop_conversation(const std::string& ns, const std::vector<TokenId>& tokens, int64_t keep);
  int32_t evict(int32_t n);
  int32_t available_after_release(const std::vector<int64_t>& ids) const;

  int32_t available() const;
  int32_t num_free() const { return num_blocks_ - live_blocks_; }
  int32_t num_cached() const { return static_cast<int32_t>(cached_.size()); }
  int32_t num_in_use() const;
  int64_t unwritten_slots() const;
  bool has(int64_t id) const { return sequences_.count(id) != 0; }
  int64_t num_tokens(int64_t id) const { return static_cast<int64_t>(sequences_.at(id).tokens.size()); }
  int64_t num_computed(int64_t id) const { return sequences_.at(id).computed; }
  // Per block of the sequence: is it cached? And which earlier index (in this
  // sequence or another) shares the block: returned as naive block ids.
  std::vector<int32_t> block_ids(int64_t id) const { return sequences_.at(id).blocks; }
  bool block_cached(int32_t naive_block) const { return blocks_[naive_block].cached; }
  std::vector<int64_t> sequence_ids() const;
  // Every cached (namespace, whole prefix), in map order.
  std::vector<std::pair<std::string, std::vector<TokenId>>> cached_keys() const {
    std::vector<std::pair<std::string, std::vector<TokenId>>> keys;
    for (const auto& [key, block] : cached_) keys.push_back(key);
    return keys;
  }

  // Counters mirrored from KvStats.
  int64_t hit_tokens = 0, miss_tokens = 0, blocks_stored = 0, blocks_deduplicated = 0, allocation_failures = 0;
  int64_t miss_by_reason[kNumMissReasons] = {};
  int64_t removed_by_reason[kNumRemovalReasons] = {};

 private:
  using Key = std::pair<std::string, std::vector<TokenId>>;  // namespace, whole prefix
  struct Block {
    int32_t ref = 0;
    bool live = false;
    bool cached = false;
    Key key;
    uint64_t last_access = 0;
    int32_t written = 0;
  };
  struct Sequence {
    std::string ns;
    std::vector<TokenId> tokens;
    std::vector<int32_t> blocks;
    int64_t computed = 0;
    int32_t next_to_cache = 0;
    // The cached block standing for each offered position: blocks[j], or the
    // cached twin of a duplicate (held with one more reference; tables never change).
    std::vector<int32_t> chain;
  };

  int32_t blocks_for(int64_t tokens) const { return static_cast<int32_t>((tokens + bs_ - 1) / bs_); }
  Key key_of(const std::string& ns, const std::vector<TokenId>& tokens, int32_t num_blocks) const;
  int32_t new_block();
  void acquire(int32_t b);
  void release_block(int32_t b);
  bool is_leaf(const Key& key) const;
  void uncache(int32_t b, RemovalReason reason);
  bool evict_one();
  int32_t matched_blocks(const std::string& ns, const std::vector<TokenId>& tokens, int32_t max_blocks) const;

  int32_t num_blocks_;
  int32_t bs_;
  uint64_t now_ = 1;
  int32_t live_blocks_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> dead_ids_;
  std::map<Key, int32_t> cached_;
  // Every key ever removed. The manager under test is configured to remember
  // them all: its bounded FIFO forgets in an order the model does not mirror
  // (a unit test covers the bound).
  std::set<Key> removed_;
  std::map<int64_t, Sequence> sequences_;
};

}  // namespace pagoda::kv::testing
