// The disk tier: blocks written by its thread are read back intact, survive a
// close and reopen (through the index, or a scan when the index is gone), a
// flipped or truncated file is a miss and is deleted, the size bound evicts
// the least recently used, a second opener of the directory is refused, an
// unwritable directory is an error naming it, and a full disk stops writes
// while reads go on. LowerTiers::fetch over the disk returns the run it holds,
// sized to it, and counts the key that ended it as a miss.

#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "pagoda/kvstore/block_record.h"
#include "pagoda/kvstore/disk_tier.h"
#include "pagoda/kvstore/lower_tiers.h"

namespace pagoda::kvstore {
namespace {
namespace fs = std::filesystem;

constexpr size_t kBlockBytes = 4096;
constexpr int64_t kRecordBytes = static_cast<int64_t>(kRecordHeaderBytes + kBlockBytes);

kv::StableKey key_of(int i) { return kv::stable_block_key(kv::stable_namespace_root("fp", "ns"), &i, 1); }

std::vector<std::byte> block_of(int i) {
  std::vector<std::byte> b(kBlockBytes);
  for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::byte>((j * 31 + static_cast<size_t>(i) * 7) & 0xff);
  return b;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/pagoda_disk_tier_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<DiskTier> open(int64_t capacity = 64 * kRecordBytes) {
    auto t = DiskTier::open({.dir = dir_, .capacity_bytes = capacity, .block_bytes = kBlockBytes});
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }
  // How many of keys 0..n-1 read back, each checked against block_of(i).
  int read_run(DiskTier& t, int n) {
    std::vector<kv::StableKey> keys;
    for (int i = 0; i < n; ++i) keys.push_back(key_of(i));
    std::vector<std::byte> out(static_cast<size_t>(n) * kBlockBytes);
    const int32_t got = t.read_prefix(keys, out);
    for (int i = 0; i < got; ++i) {
      const auto expect = block_of(i);
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), out.begin() + static_cast<std::ptrdiff_t>(i * kBlockBytes)))
          << "block " << i;
    }
    return got;
  }
  void write(DiskTier& t, int from, int to) {
    for (int i = from; i < to; ++i) {
      t.write_async(key_of(i), block_of(i));
      t.flush();  // one at a time: a deterministic LRU order
    }
  }

  fs::path dir_;
};

TEST_F(DiskTierTest, WritesReadBackAndSurviveAReopenThroughTheIndex) {
  {
    auto t = open();
    write(*t, 0, 3);
    EXPECT_EQ(read_run(*t, 5), 3);  // the run stops at the first block never written
    EXPECT_TRUE(t->probably_holds(key_of(2)));
    const TierIoStats s = t->stats();
    EXPECT_EQ(s.blocks_written, 3);
    EXPECT_EQ(s.hit_blocks, 3);
    EXPECT_EQ(s.stored_bytes, 3 * kRecordBytes);
  }
  EXPECT_TRUE(fs::exists(dir_ / "index"));
  auto again = open();
  EXPECT_EQ(again->opened_from(), "index");
  EXPECT_FALSE(fs::exists(dir_ / "index"));  // a crash from now on must rebuild
  EXPECT_EQ(read_run(*again, 3), 3);
}

TEST_F(DiskTierTest, AMissingOrCorruptIndexIsRebuiltFromTheBlockFiles) {
  {
    auto t = open();
    write(*t, 0, 3);
  }
  fs::remove(dir_ / "index");
  std::ofstream(dir_ / "blocks" / "leftover.tmp") << "torn";
  std::ofstream(dir_ / "blocks" / (kv::stable_key_hex(key_of(9)) + ".kvb")) << "short";
  {
    auto t = open();
    EXPECT_EQ(t->opened_from(), "scan");
    EXPECT_EQ(read_run(*t, 3), 3);
    EXPECT_EQ(t->stats().stored_blocks, 3);
  }
  EXPECT_FALSE(fs::exists(dir_ / "blocks" / "leftover.tmp"));
  EXPECT_FALSE(fs::exists(dir_ / "blocks" / (kv::stable_key_hex(key_of(9)) + ".kvb")));
  // A corrupt index (one flipped byte) is a scan too.
  {
    std::fstream f(dir_ / "index", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x55');
  }
  auto t = open();
  EXPECT_EQ(t->opened_from(), "scan");
  EXPECT_EQ(read_run(*t, 3), 3);
}

TEST_F(DiskTierTest, AFlippedOrTruncatedFileIsAMissAndDeleted) {
  auto t = open();
  write(*t, 0, 3);
  const fs::path second = t->block_path(key_of(1));
  {
    std::fstream f(second, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kRecordHeaderBytes + kBlockBytes / 2));
    f.put('\x7f');
  }
  EXPECT_EQ(read_run(*t, 3), 1);
  EXPECT_FALSE(fs::exists(second));
  EXPECT_EQ(t->stats().corrupt_blocks, 1);
  EXPECT_FALSE(t->probably_holds(key_of(1)));
  fs::resize_file(t->block_path(key_of(0)), kRecordBytes - 100);
  EXPECT_EQ(read_run(*t, 3), 0);
  EXPECT_EQ(t->stats().corrupt_blocks, 2);
  // Written again, they are served again.
  write(*t, 0, 2);
  EXPECT_EQ(read_run(*t, 3), 3);
}

TEST_F(DiskTierTest, TheSizeBoundEvictsTheLeastRecentlyUsed) {
  auto t = open(3 * kRecordBytes);
  write(*t, 0, 3);
  EXPECT_EQ(read_run(*t, 1), 1);  // block 0 is now the most recently used
  write(*t, 3, 4);                // room for it: block 1 (least recently used) goes
  EXPECT_TRUE(t->probably_holds(key_of(0)));
  EXPECT_FALSE(t->probably_holds(key_of(1)));
  EXPECT_TRUE(t->probably_holds(key_of(2)));
  EXPECT_TRUE(t->probably_holds(key_of(3)));
  EXPECT_FALSE(fs::exists(t->block_path(key_of(1))));
  EXPECT_EQ(t->stats().blocks_evicted, 1);
  EXPECT_LE(t->stats().stored_bytes, 3 * kRecordBytes);
}

TEST_F(DiskTierTest, ASecondOpenerOfTheDirectoryIsRefused) {
  auto first = open();
  auto second = DiskTier::open({.dir = dir_, .capacity_bytes = 64 * kRecordBytes, .block_bytes = kBlockBytes});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(dir_.string()), std::string::npos) << second.status().to_string();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
  first.reset();
  EXPECT_TRUE(open() != nullptr);  // released at close
}

TEST_F(DiskTierTest, BadOptionsAndAnUnwritableDirectoryAreErrorsNamingThem) {
  std::ofstream(dir_ / "a_file") << "x";
  const fs::path under_file = dir_ / "a_file" / "kv";
  auto t = DiskTier::open({.dir = under_file, .capacity_bytes = 64 * kRecordBytes, .block_bytes = kBlockBytes});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kIoError);
  EXPECT_NE(t.status().message().find(under_file.string()), std::string::npos) << t.status().to_string();
  auto tiny = DiskTier::open({.dir = dir_ / "x", .capacity_bytes = 10, .block_bytes = kBlockBytes});
  EXPECT_EQ(tiny.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tiny.status().message().find("--kv-offload-disk-size"), std::string::npos);
}

TEST_F(DiskTierTest, AFullDiskStopsWritesAndReadsGoOn) {
  auto t = open();
  write(*t, 0, 2);
  // The file size limit makes every block write fail as a full disk would (EFBIG).
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1000;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  t->write_async(key_of(2), block_of(2));
  t->flush();
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  TierIoStats s = t->stats();
  EXPECT_EQ(s.write_errors, 1);
  EXPECT_TRUE(s.writes_stopped);
  EXPECT_FALSE(fs::exists(t->block_path(key_of(2))));
  // Writes stay off for a while (dropped, counted); what is there is still served.
  t->write_async(key_of(3), block_of(3));
  t->flush();
  s = t->stats();
  EXPECT_EQ(s.writes_dropped, 2);
  EXPECT_EQ(read_run(*t, 4), 2);
  for (const auto& entry : fs::directory_iterator(dir_ / "blocks"))
    EXPECT_EQ(entry.path().extension(), ".kvb") << entry.path();  // no torn leftovers
}

TEST_F(DiskTierTest, LowerTiersFetchReturnsTheDiskRunSizedToItAndCountsOneMiss) {
  auto disk = open();
  write(*disk, 0, 3);
  LowerTiers tiers(kBlockBytes, std::move(disk), nullptr);
  std::vector<kv::StableKey> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(key_of(i));
  const LowerTiers::Fetched f = tiers.fetch(keys);
  EXPECT_EQ(f.from_disk, 3);
  EXPECT_EQ(f.from_redis, 0);
  ASSERT_EQ(f.data.size(), 3 * kBlockBytes) << "the buffer holds what was found, not the 40 blocks asked";
  for (int i = 0; i < 3; ++i) {
    const auto expect = block_of(i);
    EXPECT_TRUE(std::equal(expect.begin(), expect.end(), f.data.begin() + static_cast<std::ptrdiff_t>(i * kBlockBytes)));
  }
  EXPECT_EQ(tiers.stats()[0].hit_blocks, 3);
  EXPECT_EQ(tiers.stats()[0].miss_blocks, 1) << "the key that ended the run is a miss";
  // A prompt the disk has never seen: nothing read, one miss, an empty buffer.
  const std::vector<kv::StableKey> unseen = {key_of(100), key_of(101)};
  const LowerTiers::Fetched none = tiers.fetch(unseen);
  EXPECT_EQ(none.from_disk, 0);
  EXPECT_TRUE(none.data.empty());
  EXPECT_EQ(tiers.stats()[0].miss_blocks, 2);
}

}  // namespace
}  // namespace pagoda::kvstore
