// LowerTierSpiller: host blocks handed to it are read on its own thread (not
// the caller's), in order, and reach the tiers below the host with their
// bytes; wait_for(blocks) returns only once no named block is still to be
// read (the engine calls it before it overwrites host blocks) and does not
// wait for the others; wait_idle() waits for all; the destructor finishes what
// was queued.

#include "pagoda/engine/lower_tier_spiller.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/kvstore/disk_tier.h"

namespace pagoda::engine {
namespace {

constexpr size_t kBlockBytes = 256;

// A host pool of 8 blocks whose reads wait at a gate; only read_host_block is used.
class GatedRunner final : public runtime::ModelRunner {
 public:
  GatedRunner() : host_(8 * kBlockBytes) {
    for (size_t i = 0; i < host_.size(); ++i) host_[i] = static_cast<std::byte>((i * 7 + i / kBlockBytes) & 0xff);
  }
  StatusOr<runtime::StepResult> execute(const ForwardBatch&, std::span<const runtime::RowSampling>) override {
    return unimplemented_error("not used");
  }
  Status copy_blocks(std::span<const runtime::BlockCopy>) override { return unimplemented_error("not used"); }
  Status read_host_block(int32_t host_block, std::span<std::byte> out) override {
    std::unique_lock lock(mutex_);
    open_cv_.wait(lock, [&] { return open_; });
    readers_.push_back(std::this_thread::get_id());
    order_.push_back(host_block);
    if (host_block < 0 || host_block >= 8) return out_of_range_error("host block {}", host_block);
    std::memcpy(out.data(), host_.data() + static_cast<size_t>(host_block) * kBlockBytes, kBlockBytes);
    return ok_status();
  }
  const KvPoolShape& kv_geometry() const override { return shape_; }
  int32_t vocab_size() const override { return 16; }
  int32_t max_context_length() const override { return 16; }
  std::vector<int32_t> eos_token_ids() const override { return {}; }

  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    open_cv_.notify_all();
  }
  std::vector<std::thread::id> readers() {
    std::lock_guard lock(mutex_);
    return readers_;
  }
  std::vector<int32_t> order() {
    std::lock_guard lock(mutex_);
    return order_;
  }
  std::span<const std::byte> block(int32_t b) const {
    return std::span(host_).subspan(static_cast<size_t>(b) * kBlockBytes, kBlockBytes);
  }

 private:
  KvPoolShape shape_{};
  std::vector<std::byte> host_;
  std::mutex mutex_;
  std::condition_variable open_cv_;
  bool open_ = false;
  std::vector<std::thread::id> readers_;
  std::vector<int32_t> order_;
};

kv::StableKey key_of(int i) { return kv::stable_block_key(kv::stable_namespace_root("fp", "ns"), &i, 1); }

class LowerTierSpillerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pagoda_spiller_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    auto disk = kvstore::DiskTier::open({.dir = dir_, .capacity_bytes = 1 << 20, .block_bytes = kBlockBytes});
    ASSERT_TRUE(disk.ok()) << disk.status().to_string();
    tiers_ = std::make_unique<kvstore::LowerTiers>(kBlockBytes, std::move(*disk), nullptr);
  }
  void TearDown() override {
    tiers_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Every block of `blocks` (keyed key_of(block)) as the disk tier returns it.
  void expect_stored(GatedRunner& runner, const std::vector<int32_t>& blocks) {
    tiers_->flush();
    std::vector<kv::StableKey> keys;
    for (int32_t b : blocks) keys.push_back(key_of(b));
    const kvstore::LowerTiers::Fetched f = tiers_->fetch(keys);
    ASSERT_EQ(f.from_disk, static_cast<int32_t>(blocks.size()));
    for (size_t i = 0; i < blocks.size(); ++i)
      EXPECT_EQ(std::memcmp(f.data.data() + i * kBlockBytes, runner.block(blocks[i]).data(), kBlockBytes), 0)
          << "block " << blocks[i];
  }

  std::filesystem::path dir_;
  std::unique_ptr<kvstore::LowerTiers> tiers_;
};

TEST_F(LowerTierSpillerTest, WaitIdleWaitsForEveryReadWhichRunsOffTheCallersThread) {
  GatedRunner runner;
  LowerTierSpiller spiller(runner, *tiers_);
  spiller.submit({{3, key_of(3)}, {1, key_of(1)}});
  spiller.submit({{6, key_of(6)}});
  auto idle = std::async(std::launch::async, [&] { spiller.wait_idle(); });
  EXPECT_EQ(idle.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "wait_idle must not return while a read is pending";
  runner.open();
  ASSERT_EQ(idle.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(runner.order(), (std::vector<int32_t>{3, 1, 6}));
  for (std::thread::id reader : runner.readers()) EXPECT_NE(reader, std::this_thread::get_id());
  EXPECT_EQ(spiller.spilled(), 3);
  EXPECT_EQ(spiller.failed(), 0);
  expect_stored(runner, {3, 1, 6});
}

TEST_F(LowerTierSpillerTest, WaitForWaitsOnlyForTheNamedBlocksStillToBeRead) {
  GatedRunner runner;
  LowerTierSpiller spiller(runner, *tiers_);
  spiller.submit({{3, key_of(3)}, {1, key_of(1)}});
  const std::vector<int32_t> others = {0, 2, 5}, one = {5, 1};
  auto free_blocks = std::async(std::launch::async, [&] { spiller.wait_for(others); });
  EXPECT_EQ(free_blocks.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "blocks no spill names must not wait for the pending reads";
  auto pending = std::async(std::launch::async, [&] { spiller.wait_for(one); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "block 1 is still to be read";
  runner.open();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  spiller.wait_idle();
  EXPECT_EQ(spiller.spilled(), 2);
  expect_stored(runner, {3, 1});
}

TEST_F(LowerTierSpillerTest, AFailedReadIsCountedAndNotStored) {
  GatedRunner runner;
  runner.open();
  LowerTierSpiller spiller(runner, *tiers_);
  spiller.submit({{2, key_of(2)}, {99, key_of(99)}});
  spiller.wait_idle();
  EXPECT_EQ(spiller.spilled(), 1);
  EXPECT_EQ(spiller.failed(), 1);
  tiers_->flush();
  const std::vector<kv::StableKey> missing = {key_of(99)};
  EXPECT_EQ(tiers_->fetch(missing).from_disk, 0);
  expect_stored(runner, {2});
}

TEST_F(LowerTierSpillerTest, TheDestructorFinishesWhatWasQueued) {
  GatedRunner runner;
  std::thread opener;
  {
    LowerTierSpiller spiller(runner, *tiers_);
    spiller.submit({{0, key_of(0)}, {5, key_of(5)}, {7, key_of(7)}});
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      runner.open();
    });
  }
  opener.join();
  EXPECT_EQ(runner.order(), (std::vector<int32_t>{0, 5, 7}));
  expect_stored(runner, {0, 5, 7});
}

}  // namespace
}  // namespace pagoda::engine
