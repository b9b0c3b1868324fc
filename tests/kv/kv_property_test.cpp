// Property test: random operations (allocate, append, compute, fork, lookup,
// free, abort, evict, drop, dry runs; across namespaces) applied to
// KvCacheManager and to NaiveKvModel; every answer, counter and gauge must
// agree, and verify_integrity() must pass after every operation.
//
// PAGODA_KV_PROPERTY_OPS overrides the operation count (default: 1,000,000 in
// optimised builds, 100,000 in Debug).
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "kv_test_util.h"
#include "naive_kv_model.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kv/prefix_cache.h"

namespace pagoda::kv {
namespace {

using testing::NaiveKvModel;

int64_t operation_count() {
  if (const char* env = std::getenv("PAGODA_KV_PROPERTY_OPS")) return std::atoll(env);
#ifdef NDEBUG
  return 1'000'000;
#else
  return 100'000;
#endif
}

class PropertyRun {
 public:
  PropertyRun(uint64_t seed, int32_t num_blocks, int32_t block_size)
      : rng_(seed), naive_(num_blocks, block_size), bs_(block_size) {
    KvCacheConfig config;
    config.num_blocks = num_blocks;
    config.block_size = block_size;
    config.eviction_policy = EvictionPolicyKind::kLru;
    config.evicted_key_memory = std::numeric_limits<int32_t>::max();  // see NaiveKvModel::removed_
    auto created = KvCacheManager::create(config, &clock_);
    EXPECT_TRUE(created.ok());
    kv_ = std::move(created).value();
    // The naive model remembers removed keys for ever: the namespaces are
    // groups (as the server's tenants are), which are never reclaimed.
    for (const std::string& ns : names())
      EXPECT_TRUE(kv_->set_namespace_block_limit(ns, 0).ok());
  }

  // Returns false (with a gtest failure) at the first disagreement.
  bool run(int64_t ops) {
    for (step_ = 0; step_ < ops; ++step_) {
      clock_.advance(1);
      naive_.set_time(clock_.now_ns());
      one_operation();
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "first failure at step " << step_ << " (last op: " << last_op_ << ")";
        return false;
      }
    }
    const KvStats s = kv_->stats();
    std::cout << "  " << ops << " ops: hit tokens " << s.hit_tokens << ", miss tokens " << s.miss_tokens
              << ", stored " << s.blocks_stored << ", deduplicated " << s.blocks_deduplicated << ", evicted "
              << s.removed_blocks_by_reason[0] << ", dropped " << s.removed_blocks_by_reason[1] + s.removed_blocks_by_reason[2]
              << ", allocation failures " << s.allocation_failures << "\n";
    return true;
  }

 private:
  int32_t uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }

  static const std::vector<std::string>& names() {
    static const std::vector<std::string> names = {"org_1", "org_12345", "acme", ""};
    return names;
  }
  const std::string& random_namespace() {
    const std::vector<std::string>& names = PropertyRun::names();
    return names[static_cast<size_t>(uniform(0, 3))];
  }

  // Prompts drawn so prefixes repeat: a few system prompts, follow-ups of
  // earlier prompts, and a small vocabulary.
  std::vector<TokenId> random_prompt() {
    std::vector<TokenId> p;
    const int32_t kind = uniform(0, 9);
    if (kind < 4 && !history_.empty()) {
      p = history_[static_cast<size_t>(uniform(0, static_cast<int32_t>(history_.size()) - 1))];
      if (uniform(0, 3) == 0 && p.size() > 2) p.resize(static_cast<size_t>(uniform(1, static_cast<int32_t>(p.size()))));
    } else if (kind < 7) {
      const int32_t system = uniform(0, 2);
      for (int32_t i = 0; i < 2 * bs_ + system; ++i) p.push_back(1000 + system * 100 + i);
    }
    const int32_t extra = uniform(p.empty() ? 1 : 0, 3 * bs_);
    for (int32_t i = 0; i < extra; ++i) p.push_back(uniform(0, 5));
    if (p.empty()) p.push_back(1);
    if (p.size() > 12u * static_cast<size_t>(bs_)) p.resize(12u * static_cast<size_t>(bs_));
    return p;
  }

  int64_t random_live_sequence() {
    const auto ids = naive_.sequence_ids();
    if (ids.empty()) return -1;
    return ids[static_cast<size_t>(uniform(0, static_cast<int32_t>(ids.size()) - 1))];
  }

  void one_operation() {
    const int32_t op = uniform(0, 99);
    if (op < 18) op_allocate();
    else if (op < 40) op_compute();
    else if (op < 52) op_append();
    else if (op < 57) op_fork();
    else if (op < 70) op_release(/*abort=*/false);
    else if (op < 76) op_release(/*abort=*/true);
    else if (op < 86) op_lookup();
    else if (op < 91) op_dry_runs();
    else if (op < 96) op_evict();
    else if (op < 98) op_drop_conversation();
    else op_drop_namespace();
    compare_gauges();
    compare_cached_keys(step_ % 16 == 0);
    const Status integrity = kv_->verify_integrity();
    EXPECT_TRUE(integrity.ok()) << integrity.to_string();
  }

  void op_allocate() {
    last_op_ = "allocate";
    const std::string& ns = random_namespace();
    const auto prompt = random_prompt();
    EXPECT_EQ(kv_->can_allocate_sequence(ns, prompt), naive_.can_allocate_sequence(ns, prompt));
    const int64_t id = next_id_++;
    auto real = kv_->allocate_sequence(id, ns, prompt);
    const PrefixMatch expected = naive_.match(ns, prompt);
    const bool ok = naive_.allocate(id, ns, prompt);
    ASSERT_EQ(real.ok(), ok) << real.status().to_string();
    if (!ok) {
      EXPECT_EQ(real.status().code(), StatusCode::kResourceExhausted);
      return;
    }
    EXPECT_EQ(real->cached_tokens, expected.cached_tokens);
    EXPECT_EQ(real->reason, expected.reason);
    EXPECT_LT(real->cached_tokens, static_cast<int32_t>(prompt.size()));
    history_.push_back(prompt);
    if (history_.size() > 64) history_.erase(history_.begin());
    compare_table(id);
  }

  void op_compute() {
    last_op_ = "mark_computed";
    const int64_t id = random_live_sequence();
    if (id < 0) return;
    const int64_t remaining = naive_.num_tokens(id) - naive_.num_computed(id);
    if (remaining == 0) {
      EXPECT_EQ(kv_->mark_computed(id, 1).code(), StatusCode::kOutOfRange);
      return;
    }
    const int64_t n = uniform(1, static_cast<int32_t>(remaining));
    const Status s = kv_->mark_computed(id, n);
    EXPECT_TRUE(s.ok()) << s.to_string();
    naive_.mark_computed(id, n);
    compare_table(id);
  }

  void op_append() {
    last_op_ = "append_tokens";
    const int64_t id = random_live_sequence();
    if (id < 0) return;
    std::vector<TokenId> tokens(static_cast<size_t>(uniform(1, bs_ + 1)));
    for (auto& t : tokens) t = uniform(0, 5);
    EXPECT_EQ(kv_->blocks_needed_to_append(id, static_cast<int32_t>(tokens.size())),
              static_cast<int32_t>((naive_.num_tokens(id) + static_cast<int64_t>(tokens.size()) + bs_ - 1) / bs_) -
                  static_cast<int32_t>(naive_.block_ids(id).size()));
    const Status s = kv_->append_tokens(id, tokens);
    const bool ok = naive_.append(id, tokens);
    EXPECT_EQ(s.ok(), ok) << s.to_string();
    if (!ok) {
      EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
    }
    EXPECT_EQ(kv_->num_tokens(id), naive_.num_tokens(id));
    compare_table(id);
  }

  void op_fork() {
    last_op_ = "fork";
    const int64_t parent = random_live_sequence();
    if (parent < 0) return;
    const int64_t child = next_id_++;
    auto real = kv_->fork(parent, child);
    const auto expected = naive_.fork(parent, child);
    ASSERT_EQ(real.ok(), expected.has_value()) << real.status().to_string();
    if (!real.ok()) return;
    EXPECT_EQ(static_cast<int32_t>(real->size()), *expected);
    compare_table(child);
  }

  void op_release(bool abort) {
    last_op_ = abort ? "abort" : "free";
    const int64_t id = random_live_sequence();
    if (id < 0) {
      EXPECT_EQ(kv_->free_sequence(12345678).code(), StatusCode::kNotFound);
      return;
    }
    const Status s = abort ? kv_->abort_sequence(id) : kv_->free_sequence(id);
    EXPECT_TRUE(s.ok()) << s.to_string();
    naive_.release(id);
    EXPECT_FALSE(kv_->has_sequence(id));
  }

  void op_lookup() {
    last_op_ = "match_prefix";
    const std::string& ns = random_namespace();
    const auto prompt = random_prompt();
    const PrefixMatch real = kv_->match_prefix(ns, prompt);
    const PrefixMatch expected = naive_.match(ns, prompt);
    EXPECT_EQ(real.cached_tokens, expected.cached_tokens);
    EXPECT_EQ(real.reason, expected.reason) << describe(ns, prompt);
    EXPECT_EQ(static_cast<int32_t>(real.blocks.size()) * bs_, real.cached_tokens);
  }

  void op_dry_runs() {
    last_op_ = "dry runs";
    std::vector<int64_t> ids;
    for (int i = uniform(0, 3); i > 0; --i) ids.push_back(random_live_sequence());
    ids.push_back(999'999'999);  // unknown ids are ignored
    EXPECT_EQ(kv_->available_blocks_after_release(ids), naive_.available_after_release(ids));
    const int32_t tokens = uniform(0, kv_->num_blocks() * bs_ + bs_);
    EXPECT_EQ(kv_->can_allocate(tokens), (tokens + bs_ - 1) / bs_ <= naive_.available());
  }

  void op_evict() {
    last_op_ = "evict";
    const int32_t n = uniform(1, 4);
    EXPECT_EQ(kv_->evict(n), naive_.evict(n));
  }

  void op_drop_conversation() {
    last_op_ = "drop_conversation";
    if (history_.empty()) return;
    const auto& tokens = history_[static_cast<size_t>(uniform(0, static_cast<int32_t>(history_.size()) - 1))];
    const std::string& ns = random_namespace();
    const int64_t keep = uniform(0, 2 * bs_ + 2);
    EXPECT_EQ(kv_->drop_conversation(ns, tokens, keep), naive_.drop_conversation(ns, tokens, keep));
  }

  void op_drop_namespace() {
    last_op_ = "drop_namespace";
    if (uniform(0, 4) != 0) return;  // rare: it empties a quarter of the cache
    const std::string& ns = random_namespace();
    EXPECT_EQ(kv_->drop_namespace(ns), naive_.drop_namespace(ns));
  }

  static std::string describe(const std::string& ns, const std::vector<TokenId>& prompt) {
    std::string out = "namespace '" + ns + "' prompt";
    for (TokenId t : prompt) out += " " + std::to_string(t);
    return out;
  }

  // Same length, same cached flags, and the same sharing pattern (two
  // positions hold one block in the manager iff they do in the model).
  void compare_table(int64_t id) {
    if (!naive_.has(id)) return;
    const auto real = testing::table_of(*kv_, id);
    const auto model = naive_.block_ids(id);
    ASSERT_EQ(real.size(), model.size()) << "sequence " << id;
    EXPECT_EQ(kv_->num_computed_tokens(id), naive_.num_computed(id));
    std::map<BlockId, int32_t> real_to_model;
    for (size_t j = 0; j < real.size(); ++j) {
      const auto [it, inserted] = real_to_model.emplace(real[j], model[j]);
      EXPECT_EQ(it->second, model[j]) << "sequence " << id << " block #" << j << " sharing differs";
    }
    for (int64_t other : naive_.sequence_ids()) {
      const auto other_real = testing::table_of(*kv_, other);
      const auto other_model = naive_.block_ids(other);
      for (size_t j = 0; j < other_real.size(); ++j) {
        const auto it = real_to_model.find(other_real[j]);
        if (it != real_to_model.end()) {
          EXPECT_EQ(it->second, other_model[j]) << "shared with " << other;
        }
      }
    }
  }

  // The manager's cached set (rebuilt from its stored/removed events) must be
  // exactly the model's set of (namespace, prefix) keys. Sizes every step, the
  // keys themselves every `full` step (hashing them all is the slow part).
  void compare_cached_keys(bool full) {
    for (const KvEvent& e : kv_->drain_events()) {
      if (e.kind == KvEvent::Kind::kBlockStored) {
        EXPECT_TRUE(real_cached_.insert(e.key_hash).second) << "stored twice";
      } else {
        EXPECT_EQ(real_cached_.erase(e.key_hash), 1u) << "removed but never stored";
      }
    }
    ASSERT_EQ(static_cast<int32_t>(real_cached_.size()), naive_.num_cached());
    if (!full) return;
    std::set<uint64_t> expected;
    for (const auto& [ns, prefix] : naive_.cached_keys()) {
      uint64_t key = namespace_seed(ns);
      for (size_t i = 0; i < prefix.size(); i += static_cast<size_t>(bs_)) key = chain_block_hash(key, &prefix[i], bs_);
      expected.insert(key);
    }
    EXPECT_TRUE(expected == real_cached_) << "the manager caches other prefixes than the model";
    // A consumer that resynchronizes from the snapshot holds the same set, parents first.
    std::set<uint64_t> snapshot;
    for (const KvEvent& e : kv_->cached_blocks()) {
      EXPECT_TRUE(e.parent_key_hash == 0 || snapshot.count(e.parent_key_hash) == 1) << "a child before its parent";
      snapshot.insert(e.key_hash);
    }
    EXPECT_TRUE(snapshot == real_cached_) << "the snapshot differs from the events";
  }

  void compare_gauges() {
    const KvStats s = kv_->stats();
    EXPECT_EQ(s.blocks_free, naive_.num_free());
    EXPECT_EQ(s.blocks_cached, naive_.num_cached());
    EXPECT_EQ(s.blocks_in_use, naive_.num_in_use());
    EXPECT_EQ(kv_->num_available_blocks(), naive_.available());
    EXPECT_EQ(s.unwritten_slots, naive_.unwritten_slots());
    EXPECT_EQ(s.hit_tokens, naive_.hit_tokens);
    EXPECT_EQ(s.miss_tokens, naive_.miss_tokens);
    EXPECT_EQ(s.blocks_stored, naive_.blocks_stored);
    EXPECT_EQ(s.blocks_deduplicated, naive_.blocks_deduplicated);
    EXPECT_EQ(s.allocation_failures, naive_.allocation_failures);
    for (int r = 0; r < kNumMissReasons; ++r) EXPECT_EQ(s.miss_tokens_by_reason[r], naive_.miss_by_reason[r]) << r;
    for (int r = 0; r < kNumRemovalReasons; ++r)
      EXPECT_EQ(s.removed_blocks_by_reason[r], naive_.removed_by_reason[r]) << r;
  }

  ManualClock clock_;
  std::mt19937_64 rng_;
  std::unique_ptr<KvCacheManager> kv_;
  NaiveKvModel naive_;
  int32_t bs_;
  int64_t next_id_ = 1;
  int64_t step_ = 0;
  std::string last_op_;
  std::vector<std::vector<TokenId>> history_;
  std::set<uint64_t> real_cached_;
};

TEST(KvProperty, MillionRandomOperationsAgreeWithTheNaiveModel) {
  // Split over a few shapes: a tight pool (constant eviction), a roomier one,
  // block size 1 and an odd block size.
  const int64_t total = operation_count();
  struct Shape {
    uint64_t seed;
    int32_t num_blocks;
    int32_t block_size;
    double share;
  };
  const Shape shapes[] = {{1, 24, 4, 0.4}, {2, 64, 4, 0.3}, {3, 40, 1, 0.15}, {4, 32, 3, 0.15}};
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(::testing::Message() << "seed " << shape.seed << " blocks " << shape.num_blocks << " block size "
                                      << shape.block_size);
    PropertyRun run(shape.seed, shape.num_blocks, shape.block_size);
    if (!run.run(static_cast<int64_t>(total * shape.share))) return;
  }
}

TEST(KvProperty, ValueAwarePolicyKeepsEveryInvariant) {
  // Eviction order differs from LRU, so only invariants are checked here.
  ManualClock clock;
  auto kv = testing::make_manager(24, 4, &clock, EvictionPolicyKind::kValueAware);
  std::mt19937_64 rng(11);
  std::vector<SequenceId> live;
  SequenceId next = 1;
  const int64_t ops = operation_count() / 20;
  for (int64_t step = 0; step < ops; ++step) {
    clock.advance(1);
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {
      std::vector<TokenId> prompt(1 + rng() % 20);
      for (auto& t : prompt) t = static_cast<TokenId>(rng() % 3);
      if (kv->allocate_sequence(next, rng() % 2 ? "a" : "b", prompt).ok()) live.push_back(next);
      ++next;
    } else if (op < 7 && !live.empty()) {
      const SequenceId id = live[rng() % live.size()];
      const int64_t remaining = kv->num_tokens(id) - kv->num_computed_tokens(id);
      if (remaining > 0) {
        ASSERT_TRUE(kv->mark_computed(id, 1 + static_cast<int64_t>(rng() % remaining)).ok());
      } else {
        (void)kv->append_tokens(id, std::vector<TokenId>{static_cast<TokenId>(rng() % 3)});
      }
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(kv->free_sequence(live[i]).ok());
      live.erase(live.begin() + static_cast<int64_t>(i));
    }
    const Status s = kv->verify_integrity();
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.to_string();
  }
  for (SequenceId id : live) ASSERT_TRUE(kv->free_sequence(id).ok());
  EXPECT_EQ(kv->stats().blocks_in_use, 0);
  EXPECT_EQ(kv->num_available_blocks(), 24);
}

}  // namespace
}  // namespace pagoda::kv
