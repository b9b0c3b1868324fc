// Lower-tier (disk) hits through the engine on the CPU backend with the
// bundled model (models/pagoda-tiny), read off the engine thread
// (engine/lower_tier_loader.h):
//  - a disk hit in a fresh runner (nothing of the first run's K/V in memory)
//    gives the miss's greedy output at block sizes 16, 3 and 1, read by
//    several reader threads, none of them the engine's;
//  - a read held at a gate does not stall another sequence's decode: while it
//    waits, steps stay short and the other sequence keeps producing tokens
//    (a synchronous read would hold the first step until the gate gives up);
//  - a request aborted while its reads are in flight leaks nothing: its
//    reserved host blocks stay held (integrity checked every step) until the
//    reads finish, then every host block is free or evictable again;
//  - a corrupt block in the middle of the run ends the hit there: the rest is
//    recomputed and the output is the miss's.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kvstore/disk_tier.h"
#include "pagoda/kvstore/lower_tiers.h"

namespace pagoda {
namespace {

using Ms = std::chrono::milliseconds;

std::shared_ptr<CpuModel> tiny_model() {
  static std::shared_ptr<CpuModel> model = [] {
    auto loaded = CpuModel::load(std::string(PAGODA_SOURCE_DIR) + "/models/pagoda-tiny");
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    return loaded.ok() ? std::shared_ptr<CpuModel>(std::move(*loaded)) : nullptr;
  }();
  return model;
}

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 131 + salt * 977 + 7) % 4000 + 3);
  return p;
}

constexpr const char* kFingerprint = "cpu-lower-tier-test";

// A disk tier whose reads wait at a gate (closed: they block until open() or
// `give_up` passes) and record which threads read.
class GatedStore final : public kvstore::BlockStore {
 public:
  GatedStore(std::unique_ptr<kvstore::DiskTier> inner, bool closed) : inner_(std::move(inner)), closed_(closed) {}
  std::string_view name() const override { return inner_->name(); }
  int32_t read_into(std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs) override {
    {
      std::unique_lock lock(mutex_);
      readers_.insert(std::this_thread::get_id());
      ++waiting_;
      gate_.wait_for(lock, give_up, [&] { return !closed_; });
      --waiting_;
    }
    return inner_->read_into(keys, outs);
  }
  void write_async(const kv::StableKey& key, std::vector<std::byte> block) override {
    inner_->write_async(key, std::move(block));
  }
  bool probably_holds(const kv::StableKey& key) const override { return inner_->probably_holds(key); }
  void flush() override { inner_->flush(); }
  kvstore::TierIoStats stats() const override { return inner_->stats(); }
  std::string describe() const override { return inner_->describe(); }

  void open() {
    {
      std::lock_guard lock(mutex_);
      closed_ = false;
    }
    gate_.notify_all();
  }
  int32_t waiting() const {
    std::lock_guard lock(mutex_);
    return waiting_;
  }
  std::set<std::thread::id> readers() const {
    std::lock_guard lock(mutex_);
    return readers_;
  }
  kvstore::DiskTier& inner() { return *inner_; }

  static constexpr Ms give_up{4000};

 private:
  std::unique_ptr<kvstore::DiskTier> inner_;
  mutable std::mutex mutex_;
  std::condition_variable gate_;
  bool closed_;
  int32_t waiting_ = 0;
  std::set<std::thread::id> readers_;
};

class CpuLowerTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(tiny_model(), nullptr);
    dir_ = std::filesystem::temp_directory_path() /
           ("pagoda_cpu_lower_tier_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    eng_.reset();
    tiers_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A fresh runner, KV manager and engine (fresh pools: no K/V of an earlier
  // engine), over the disk tier in dir_ (opened anew; its gate closed or not).
  void open_engine(int32_t block_size, bool gate_closed = false, DType dtype = DType::kF32) {
    eng_.reset();
    tiers_.reset();
    const int32_t device_blocks = 256 / block_size + 2, host_blocks = 4 * device_blocks;
    auto created = CpuModelRunner::create(tiny_model(), device_blocks, block_size, dtype, dtype, host_blocks);
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    runner_ = std::move(*created);
    auto disk = kvstore::DiskTier::open(
        {.dir = dir_, .capacity_bytes = int64_t{1} << 30, .block_bytes = runner_->host_block_bytes()});
    ASSERT_TRUE(disk.ok()) << disk.status().to_string();
    auto gated = std::make_unique<GatedStore>(std::move(*disk), gate_closed);
    store_ = gated.get();
    tiers_ = std::make_unique<kvstore::LowerTiers>(runner_->host_block_bytes(), std::move(gated), nullptr);
    kv::KvCacheConfig kc;
    kc.num_blocks = device_blocks;
    kc.block_size = block_size;
    kc.num_host_blocks = host_blocks;
    kc.stable_key_fingerprint = kFingerprint;
    kc.host_write_through = true;
    kv_ = std::move(kv::KvCacheManager::create(kc)).value();
    engine::EngineConfig ec;
    ec.scheduler.max_tokens_per_step = 64;
    ec.lower_tiers = tiers_.get();
    auto made = engine::Engine::create(ec, *runner_, *kv_);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    eng_ = std::move(*made);
  }
  // Stops the engine (its last blocks reach the disk) and closes the tier (the index is written).
  void close_engine() {
    if (eng_) eng_->shutdown(Ms(0));
    eng_.reset();
    if (tiers_) tiers_->flush();
    tiers_.reset();
    store_ = nullptr;
  }

  std::shared_ptr<engine::RequestStream> submit(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    engine::GenerationRequest r;
    r.prompt_tokens = prompt;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    auto s = eng_->submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : nullptr;
  }
  // Drains a stream's deltas so far into `tokens`; true once it finished.
  static bool drain(engine::RequestStream& s, std::vector<int32_t>& tokens, int32_t* cached = nullptr,
                    std::string* error = nullptr) {
    bool finished = false;
    while (auto out = s.next(Ms(0))) {
      for (const auto& c : out->choices) tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
      if (error != nullptr && !out->error.empty()) *error = out->error;
      if (out->finished) {
        finished = true;
        if (cached) *cached = out->usage.cached_tokens;
      }
    }
    return finished;
  }
  // Steps until idle with integrity checks; returns the request's tokens.
  std::vector<int32_t> run(const std::vector<int32_t>& prompt, int32_t max_tokens, int32_t* cached = nullptr) {
    auto s = submit(prompt, max_tokens);
    if (s == nullptr) return {};
    std::vector<int32_t> tokens;
    std::string error;
    while (eng_->step()) {
      const Status integrity = eng_->verify_integrity();
      EXPECT_TRUE(integrity.ok()) << integrity.to_string();
      if (!integrity.ok()) break;
    }
    EXPECT_TRUE(drain(*s, tokens, cached, &error)) << "the request must finish";
    EXPECT_TRUE(error.empty()) << error;
    return tokens;
  }
  // Every host block free or evictable: nothing reserved or held.
  void expect_host_tier_released() {
    const kv::KvStats stats = kv_->stats();
    EXPECT_EQ(stats.host_blocks_reserved, 0);
    EXPECT_EQ(stats.host_blocks_free + stats.host_blocks_cached, stats.host_blocks_total)
        << "every host block free or cached: none held";
    const Status integrity = kv_->verify_integrity();
    EXPECT_TRUE(integrity.ok()) << integrity.to_string();
  }

  std::filesystem::path dir_;
  std::unique_ptr<CpuModelRunner> runner_;
  std::unique_ptr<kvstore::LowerTiers> tiers_;
  GatedStore* store_ = nullptr;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<engine::Engine> eng_;
};

TEST_F(CpuLowerTierTest, ADiskHitGivesTheMissOutputAtEveryBlockSize) {
  // On the f32-exact GEMM path, as CpuHostTierTest's hit-equals-miss test (a hit recomputes fewer tokens
  // than the miss's bf16-GEMM chunk, and a near tie under fp8 KV may flip with that rounding).
  const kernels::ScopedBf16Gemm exact(false);
  for (const int32_t bs : {16, 3, 1}) {
    for (DType dtype : {DType::kF32, DType::kFP8E4M3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " block size " + std::to_string(bs));
      std::filesystem::remove_all(dir_);
      const std::vector<int32_t> prompt = prompt_of(48, 1);
      const int32_t full = 47 / bs;
      open_engine(bs, false, dtype);
      int32_t cached = -1;
      const std::vector<int32_t> miss = run(prompt, 8, &cached);
      EXPECT_EQ(cached, 0);
      close_engine();
      // The gate holds the readers until two of them wait on chunks of the run (47 blocks at size 1:
      // several chunks), so the run is seen read in parallel.
      open_engine(bs, /*gate_closed=*/true, dtype);
      auto s = submit(prompt, 8);
      ASSERT_TRUE(eng_->step());
      const int32_t want_waiting = full >= 8 ? 2 : 1;
      for (int i = 0; i < 2000 && store_->waiting() < want_waiting; ++i) std::this_thread::sleep_for(Ms(1));
      EXPECT_GE(store_->waiting(), want_waiting);
      store_->open();
      std::vector<int32_t> hit;
      std::string error;
      while (eng_->step()) ASSERT_TRUE(eng_->verify_integrity().ok()) << eng_->verify_integrity().to_string();
      EXPECT_TRUE(drain(*s, hit, &cached, &error));
      EXPECT_TRUE(error.empty()) << error;
      EXPECT_EQ(cached, full * bs) << "served from the disk tier";
      EXPECT_EQ(hit, miss) << "a disk hit must give the miss's greedy output";
      const engine::EngineStats stats = eng_->stats();
      EXPECT_EQ(stats.kv.hit_tokens_by_lower_tier[0], full * bs);
      EXPECT_EQ(stats.lower_tier_blocks_loaded, full);
      EXPECT_EQ(stats.lower_tier_loads, 1);
      EXPECT_EQ(stats.lower_tier_loads_in_flight, 0);
      EXPECT_GE(store_->readers().size(), static_cast<size_t>(want_waiting)) << "a long run is read by several readers";
      EXPECT_FALSE(store_->readers().contains(std::this_thread::get_id())) << "never on the engine's thread";
      expect_host_tier_released();
      close_engine();
    }
  }
}

TEST_F(CpuLowerTierTest, ASlowReadDoesNotStallAnotherSequencesDecode) {
  const std::vector<int32_t> prompt = prompt_of(96, 2);
  open_engine(4);
  const std::vector<int32_t> miss = run(prompt, 8);
  close_engine();
  open_engine(4, /*gate_closed=*/true);
  // A decodes; then B arrives with its prefix on disk, and its reads wait at the gate.
  auto a = submit(prompt_of(20, 3), 200);
  std::vector<int32_t> a_tokens;
  while (a_tokens.empty()) {
    ASSERT_TRUE(eng_->step());
    drain(*a, a_tokens);
  }
  auto b = submit(prompt, 8);
  const size_t a_before = a_tokens.size();
  Ms longest{0};
  for (int i = 0; i < 10; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(eng_->step());
    longest = std::max(longest, std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - start));
    const Status integrity = eng_->verify_integrity();
    ASSERT_TRUE(integrity.ok()) << integrity.to_string();
  }
  drain(*a, a_tokens);
  // A synchronous read would have held a step until the gate gave up.
  EXPECT_LT(longest, GatedStore::give_up / 4);
  EXPECT_GE(a_tokens.size(), a_before + 10) << "A decodes one token per step while B's blocks are read";
  EXPECT_EQ(eng_->stats().lower_tier_loads_in_flight, 1);
  EXPECT_GT(kv_->stats().host_blocks_reserved, 0) << "B's host blocks are held while read";
  std::vector<int32_t> b_tokens;
  EXPECT_FALSE(drain(*b, b_tokens));
  EXPECT_TRUE(b_tokens.empty()) << "B holds no step while its blocks are read";
  store_->open();
  int32_t b_cached = -1;
  while (!drain(*b, b_tokens, &b_cached)) ASSERT_TRUE(eng_->step());
  EXPECT_EQ(b_cached, 95 / 4 * 4);
  EXPECT_EQ(b_tokens, miss);
  eng_->abort(a->id());
  while (eng_->step()) {
  }
  expect_host_tier_released();
}

TEST_F(CpuLowerTierTest, AnAbortWhileReadsAreInFlightLeaksNothing) {
  const std::vector<int32_t> prompt = prompt_of(96, 4);
  open_engine(4);
  const std::vector<int32_t> miss = run(prompt, 8);
  close_engine();
  open_engine(4, /*gate_closed=*/true);
  auto b = submit(prompt, 8);
  ASSERT_TRUE(eng_->step());  // B's load starts
  EXPECT_EQ(eng_->stats().lower_tier_loads_in_flight, 1);
  EXPECT_EQ(kv_->stats().host_blocks_reserved, 95 / 4);
  ASSERT_TRUE(kv_->verify_integrity().ok()) << kv_->verify_integrity().to_string();
  eng_->abort(b->id());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(eng_->step()) << "the reads are still in flight";
    const Status integrity = eng_->verify_integrity();
    ASSERT_TRUE(integrity.ok()) << integrity.to_string();
  }
  std::vector<int32_t> tokens;
  EXPECT_TRUE(drain(*b, tokens)) << "the abort ends the request at once";
  EXPECT_GT(kv_->stats().host_blocks_reserved, 0) << "held while a reader may write them";
  store_->open();
  while (eng_->step()) {
  }
  EXPECT_EQ(eng_->stats().lower_tier_loads_in_flight, 0);
  expect_host_tier_released();
  // The aborted load adopted nothing; a later request reads the blocks again.
  int32_t cached = -1;
  EXPECT_EQ(run(prompt, 8, &cached), miss);
  EXPECT_EQ(cached, 95 / 4 * 4);
  expect_host_tier_released();
}

TEST_F(CpuLowerTierTest, ACorruptBlockMidRunEndsTheHitThereAndTheRestIsRecomputed) {
  const std::vector<int32_t> prompt = prompt_of(96, 5);
  open_engine(4);
  const std::vector<int32_t> miss = run(prompt, 8);
  const std::vector<kv::StableKey> keys = kv_->stable_keys("", prompt, 95 / 4);
  close_engine();
  {
    // One byte in the middle of block 10's payload flipped (the index still lists it).
    const std::filesystem::path file = dir_ / "blocks" / (kv::stable_key_hex(keys[10]) + ".kvb");
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << file;
    const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(file) / 2);
    f.seekg(middle);
    const char was = static_cast<char>(f.get());
    f.seekp(middle);
    f.put(static_cast<char>(was ^ 0x40));
  }
  open_engine(4);
  int32_t cached = -1;
  EXPECT_EQ(run(prompt, 8, &cached), miss) << "never wrong K/V";
  EXPECT_EQ(cached, 10 * 4) << "the hit ends at the corrupt block";
  EXPECT_EQ(store_->inner().stats().corrupt_blocks, 1);
  expect_host_tier_released();
}

}  // namespace
}  // namespace pagoda
