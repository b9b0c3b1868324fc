// A random walk over the KV manager with a host tier, against simulated
// memory: every slot of the device pool and the host pool holds a tag, the
// "K/V" of a position, which is a hash of every token up to it. A simulated
// forward writes the tags of the tokens it computes through the block table;
// the manager's transfers are run in order on the two arrays (or fail, and
// garbage lands at their destinations); and after every operation every
// running sequence must read back exactly the tags of its own tokens. A wrong
// demotion, promotion, swap or failure path serves a wrong tag. Integrity is
// checked after every operation too.

#include <algorithm>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "kv_test_util.h"
#include "pagoda/kv/kv_cache_manager.h"

namespace pagoda::kv {
namespace {

uint64_t position_tag(const std::vector<TokenId>& tokens, size_t pos) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i <= pos; ++i) h = (h ^ static_cast<uint64_t>(tokens[i] + 7)) * 1099511628211ull;
  return h | 1;  // never 0 (0: never written)
}

struct SimSequence {
  std::string ns;
  std::vector<TokenId> tokens;  // reserved tokens
  int64_t computed = 0;
  bool swapped = false;
};

class HostTierWalk {
 public:
  // write_through: the settings a disk or redis tier below the host brings
  // (stable keys, every cached block copied to a host twin at once).
  HostTierWalk(uint32_t seed, int32_t device_blocks, int32_t host_blocks, int32_t block_size,
               bool write_through = false)
      : rng_(seed), bs_(block_size),
        device_(static_cast<size_t>(device_blocks) * block_size, 0),
        host_(static_cast<size_t>(host_blocks) * block_size, 0) {
    KvCacheConfig config;
    config.num_blocks = device_blocks;
    config.num_host_blocks = host_blocks;
    config.block_size = block_size;
    config.evicted_key_memory = 64;
    if (write_through) {
      config.stable_key_fingerprint = "walk";
      config.host_write_through = true;
    }
    kv_ = std::move(KvCacheManager::create(config, &clock_)).value();
    // Conversations: prompts share long prefixes, so hits in both tiers are common.
    for (int c = 0; c < 6; ++c) {
      std::vector<TokenId> t(static_cast<size_t>(bs_ * 6));
      for (auto& x : t) x = static_cast<TokenId>(rng_() % 5);
      stems_.push_back(std::move(t));
    }
  }

  // Runs the pending transfers on the simulated memory, or fails them.
  void flush(bool fail) {
    const std::vector<BlockTransfer> moves = kv_->take_transfers();
    if (moves.empty()) return;
    if (!fail) {
      for (const BlockTransfer& t : moves) {
        uint64_t* device = &device_[static_cast<size_t>(t.device_block) * bs_];
        uint64_t* host = &host_[static_cast<size_t>(t.host_block) * bs_];
        if (t.direction == TransferDirection::kDeviceToHost) std::copy_n(device, bs_, host);
        else std::copy_n(host, bs_, device);
      }
      transfers_ += static_cast<int64_t>(moves.size());
      return;
    }
    for (const BlockTransfer& t : moves) {
      uint64_t* dst = t.direction == TransferDirection::kDeviceToHost ? &host_[static_cast<size_t>(t.host_block) * bs_]
                                                                        : &device_[static_cast<size_t>(t.device_block) * bs_];
      std::fill_n(dst, bs_, 0xBADull);
    }
    ++failures_;
    for (SequenceId id : kv_->transfers_failed(moves)) {
      // The engine recomputes these: free them, start over from the prompt.
      PAGODA_ASSERT_OK(kv_->free_sequence(id));
      SimSequence s = seqs_.at(id);
      seqs_.erase(id);
      ++recomputed_;
      restart(s);
    }
    flush(false);  // the restarts' own transfers (host hits) run before any forward
  }

  void restart(const SimSequence& old) {
    const SequenceId id = next_id_++;
    auto match = kv_->allocate_sequence(id, old.ns, old.tokens);
    if (!match.ok()) return;  // dropped: fine for the walk
    seqs_[id] = SimSequence{old.ns, old.tokens, match->cached_tokens, false};
  }

  // The simulated forward: writes the tags of `n` more tokens of `id`.
  void compute(SequenceId id, int64_t n) {
    SimSequence& s = seqs_.at(id);
    auto table = kv_->block_table(id);
    ASSERT_TRUE(table.ok()) << table.status().to_string();
    for (int64_t p = s.computed; p < s.computed + n; ++p)
      device_[static_cast<size_t>((*table)[p / bs_]) * bs_ + p % bs_] = position_tag(s.tokens, static_cast<size_t>(p));
    PAGODA_ASSERT_OK(kv_->mark_computed(id, n));
    s.computed += n;
  }

  void check_memory() {
    for (const auto& [id, s] : seqs_) {
      if (s.swapped) continue;
      auto table = kv_->block_table(id);
      ASSERT_TRUE(table.ok());
      ASSERT_EQ(kv_->num_computed_tokens(id), s.computed);
      for (int64_t p = 0; p < s.computed; ++p) {
        const uint64_t got = device_[static_cast<size_t>((*table)[p / bs_]) * bs_ + p % bs_];
        ASSERT_EQ(got, position_tag(s.tokens, static_cast<size_t>(p)))
            << "sequence " << id << " reads wrong K/V at position " << p << " (block " << (*table)[p / bs_] << ")";
      }
    }
  }

  void step(int op_number) {
    const bool fail = rng_() % 40 == 0;
    const int op = static_cast<int>(rng_() % 100);
    std::vector<SequenceId> ids;
    for (const auto& [id, s] : seqs_) ids.push_back(id);
    const SequenceId any = ids.empty() ? -1 : ids[rng_() % ids.size()];
    if (op < 30 || ids.empty()) {
      // A new request: a stem prefix (some turns of a conversation) plus a tail.
      const auto& stem = stems_[rng_() % stems_.size()];
      std::vector<TokenId> prompt(stem.begin(), stem.begin() + 1 + static_cast<int64_t>(rng_() % stem.size()));
      for (int i = static_cast<int>(rng_() % 5); i > 0; --i) prompt.push_back(static_cast<TokenId>(rng_() % 5));
      const std::string ns = rng_() % 8 == 0 ? "b" : "a";
      const SequenceId id = next_id_++;
      if (kv_->can_allocate_sequence(ns, prompt)) {
        auto match = kv_->allocate_sequence(id, ns, prompt);
        ASSERT_TRUE(match.ok()) << match.status().to_string();
        seqs_[id] = SimSequence{ns, prompt, match->cached_tokens, false};
        host_hits_ += match->host_blocks;
      }
    } else if (op < 55) {
      SimSequence& s = seqs_.at(any);
      if (s.swapped) {
        if (kv_->can_swap_in(any)) {
          PAGODA_ASSERT_OK(kv_->swap_in(any));
          s.swapped = false;
        }
      } else if (s.computed < static_cast<int64_t>(s.tokens.size())) {
        flush(fail);  // a forward runs only after the step's transfers
        if (!seqs_.count(any)) return;
        const int64_t left = static_cast<int64_t>(s.tokens.size()) - s.computed;
        compute(any, 1 + static_cast<int64_t>(rng_() % static_cast<uint64_t>(left)));
      } else if (kv_->blocks_needed_to_append(any, 1) <= kv_->num_available_blocks()) {
        const TokenId t = static_cast<TokenId>(rng_() % 5);
        PAGODA_ASSERT_OK(kv_->append_tokens(any, std::vector<TokenId>{t}));
        s.tokens.push_back(t);
        flush(fail);
        if (!seqs_.count(any)) return;
        compute(any, 1);
      }
    } else if (op < 70) {
      SimSequence& s = seqs_.at(any);
      if (!s.swapped) {
        const Status st = kv_->swap_out(any);
        if (st.ok()) s.swapped = true;
        else ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
      }
    } else if (op < 88) {
      PAGODA_ASSERT_OK(rng_() % 2 ? kv_->free_sequence(any) : kv_->abort_sequence(any));
      seqs_.erase(any);
    } else if (op < 95) {
      kv_->evict(1 + static_cast<int32_t>(rng_() % 3));
    } else if (op < 97) {
      kv_->drop_namespace("b");
    } else {
      clock_.advance(1000);
    }
    clock_.advance(1);
    if (op_number % 7 == 0) flush(fail);
    const Status integrity = kv_->verify_integrity();
    ASSERT_TRUE(integrity.ok()) << "after op " << op_number << " (" << op << "): " << integrity.to_string();
  }

  void run(int ops) {
    for (int i = 0; i < ops; ++i) {
      ASSERT_NO_FATAL_FAILURE(step(i));
      if (!kv_->has_pending_transfers()) ASSERT_NO_FATAL_FAILURE(check_memory()) << "after op " << i;
    }
    flush(false);
    ASSERT_NO_FATAL_FAILURE(check_memory());
  }

  KvCacheManager& kv() { return *kv_; }
  int64_t transfers_ = 0, failures_ = 0, recomputed_ = 0, host_hits_ = 0;

 private:
  std::mt19937 rng_;
  int32_t bs_;
  ManualClock clock_;
  std::unique_ptr<KvCacheManager> kv_;
  std::vector<uint64_t> device_, host_;
  std::vector<std::vector<TokenId>> stems_;
  std::map<SequenceId, SimSequence> seqs_;
  SequenceId next_id_ = 1;
};

TEST(HostTierProperty, RandomWalksWithWriteThroughAndStableKeysReadBackTheirOwnKv) {
  for (const int32_t bs : {4, 1}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      HostTierWalk walk(seed * 104729 + static_cast<uint32_t>(bs), 24 / bs + 6, 40 / bs + 4, bs, /*write_through=*/true);
      ASSERT_NO_FATAL_FAILURE(walk.run(3000)) << "block size " << bs << " seed " << seed;
      const KvStats stats = walk.kv().stats();
      EXPECT_GT(stats.blocks_written_back, 0);  // (StableKeyTest checks a twin per inserted block)
      EXPECT_GT(stats.blocks_promoted, 0);
      EXPECT_GT(stats.swap_ins, 0);
    }
  }
}

TEST(HostTierProperty, RandomWalksReadBackTheirOwnKvAtBlockSizes4And3And1) {
  for (const int32_t bs : {4, 3, 1}) {
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      HostTierWalk walk(seed * 7919 + static_cast<uint32_t>(bs), /*device=*/24 / bs + 6, /*host=*/40 / bs + 4, bs);
      ASSERT_NO_FATAL_FAILURE(walk.run(4000)) << "block size " << bs << " seed " << seed;
      const KvStats stats = walk.kv().stats();
      // The walk must exercise every path it claims to test.
      EXPECT_GT(stats.blocks_demoted, 0);
      EXPECT_GT(stats.blocks_promoted, 0);
      EXPECT_GT(stats.swap_ins, 0);
      EXPECT_GT(stats.host_blocks_evicted, 0);
      EXPECT_GT(walk.failures_, 0);
      EXPECT_GT(walk.host_hits_, 0);
    }
  }
}

}  // namespace
}  // namespace pagoda::kv
