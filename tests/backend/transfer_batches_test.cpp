// runtime::plan_transfer_batches: running the batches one after another, each
// batch's copies all at once (every read before any write), leaves the pools
// exactly as running the list in order does; no batch touches a block twice;
// and a full pool's "write back, then reload into the freed block" list is two
// batches however long it is.

#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/runtime/transfer_batches.h"

namespace pagoda::runtime {
namespace {

constexpr auto kD2H = TransferDirection::kDeviceToHost;
constexpr auto kH2D = TransferDirection::kHostToDevice;

struct Pools {
  std::vector<int> device, host;
  bool operator==(const Pools&) const = default;
};

Pools run_in_order(Pools p, const std::vector<BlockTransfer>& list) {
  for (const BlockTransfer& t : list) {
    if (t.direction == kD2H) p.host[t.host_block] = p.device[t.device_block];
    else p.device[t.device_block] = p.host[t.host_block];
  }
  return p;
}

Pools run_batches(Pools p, const std::vector<TransferBatch>& batches) {
  for (const TransferBatch& b : batches) {
    // All at once: read every source first, then write every destination.
    std::vector<int> values[kNumTransferDirections];
    for (int d = 0; d < kNumTransferDirections; ++d)
      for (size_t i = 0; i < b.device_blocks[d].size(); ++i)
        values[d].push_back(d == static_cast<int>(kD2H) ? p.device[b.device_blocks[d][i]]
                                                        : p.host[b.host_blocks[d][i]]);
    for (int d = 0; d < kNumTransferDirections; ++d)
      for (size_t i = 0; i < b.device_blocks[d].size(); ++i) {
        if (d == static_cast<int>(kD2H)) p.host[b.host_blocks[d][i]] = values[d][i];
        else p.device[b.device_blocks[d][i]] = values[d][i];
      }
  }
  return p;
}

TEST(TransferBatchesTest, BatchesRunAllAtOnceEqualTheListInOrder) {
  std::mt19937 rng(3);
  for (int round = 0; round < 2000; ++round) {
    const int devices = 1 + static_cast<int>(rng() % 8), hosts = 1 + static_cast<int>(rng() % 8);
    std::vector<BlockTransfer> list(rng() % 24);
    for (BlockTransfer& t : list)
      t = {rng() % 2 ? kD2H : kH2D, static_cast<int32_t>(rng() % devices), static_cast<int32_t>(rng() % hosts)};
    Pools start{std::vector<int>(devices), std::vector<int>(hosts)};
    for (int i = 0; i < devices; ++i) start.device[i] = i;
    for (int i = 0; i < hosts; ++i) start.host[i] = 100 + i;
    const std::vector<TransferBatch> batches = plan_transfer_batches(list);
    int64_t count = 0;
    for (const TransferBatch& b : batches) {
      EXPECT_GT(b.size(), 0);
      count += b.size();
      std::set<int64_t> touched;
      for (int d = 0; d < kNumTransferDirections; ++d)
        for (size_t i = 0; i < b.device_blocks[d].size(); ++i) {
          EXPECT_TRUE(touched.insert(b.device_blocks[d][i]).second) << "device block twice in a batch";
          EXPECT_TRUE(touched.insert(-1 - int64_t{b.host_blocks[d][i]}).second) << "host block twice in a batch";
        }
    }
    EXPECT_EQ(count, static_cast<int64_t>(list.size()));
    ASSERT_EQ(run_batches(start, batches), run_in_order(start, list)) << "round " << round;
  }
}

TEST(TransferBatchesTest, WriteBackThenReloadIsTwoBatches) {
  // Device blocks 0..99 go out to host 0..99, and host 100..199 come into the freed blocks, pairwise.
  std::vector<BlockTransfer> list;
  for (int32_t i = 0; i < 100; ++i) {
    list.push_back({kD2H, i, i});
    list.push_back({kH2D, i, 100 + i});
  }
  const std::vector<TransferBatch> batches = plan_transfer_batches(list);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].device_blocks[static_cast<int>(kD2H)].size(), 100u);
  EXPECT_EQ(batches[1].device_blocks[static_cast<int>(kH2D)].size(), 100u);
  EXPECT_EQ(batches[1].host_blocks[static_cast<int>(kH2D)].front(), 100);
  EXPECT_TRUE(plan_transfer_batches({}).empty());
}

}  // namespace
}  // namespace pagoda::runtime
