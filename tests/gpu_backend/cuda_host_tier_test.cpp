// The host tier on the GPU: the pinned host pool's transfers move every byte
// of a block (codes and scales, every layer) for every KV dtype and copy
// method, in list order across batches; loads issued layer by layer are ready
// layer by layer; and through the engine on a fixture model, a host-tier hit
// (loads layer by layer or whole) and preemption by swap give exactly the
// output of a miss / no preemption; a disk-tier hit (blocks spilled by the
// engine's spiller thread while forwards run, read back into a fresh engine
// through the host pool) gives the output of the miss that wrote them.

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_host_kv_pool.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kvstore/disk_tier.h"
#include "pagoda/kvstore/lower_tiers.h"
#include "pagoda/runtime/delegating_model_runner.h"
#include "pagoda/runtime/host_block_layout.h"

namespace pagoda::cuda {
namespace {

using runtime::BlockTransfer;
using runtime::TransferDirection;
constexpr auto kD2H = TransferDirection::kDeviceToHost;
constexpr auto kH2D = TransferDirection::kHostToDevice;

// Block `block` of the device pool, read back piece by piece in host-block order.
std::vector<std::byte> device_block(const CudaKvPool& pool, int32_t block) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  std::vector<std::byte> bytes(runtime::host_block_layout(pool.shape()).block_bytes());
  pool.append_block_copies(block, bytes.data(), /*to_host=*/true, dsts, srcs, sizes);
  for (size_t i = 0; i < dsts.size(); ++i)
    EXPECT_EQ(cudaMemcpy(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToHost), cudaSuccess);
  return bytes;
}

TEST(CudaHostTierTest, TransfersMoveEveryByteInListOrderForEveryKvDtype) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::pair<DType, DType> dtypes[] = {{DType::kBF16, DType::kBF16}, {DType::kFP8E4M3, DType::kFP8E4M3},
                                            {DType::kInt8, DType::kInt8}, {DType::kInt4, DType::kInt4},
                                            {DType::kInt8, DType::kInt4}};
  using Method = CudaHostKvPool::CopyMethod;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // (device->host, host->device) methods.
  const std::pair<Method, Method> methods[] = {{Method::kKernel, Method::kKernel},
                                               {Method::kBatchedMemcpy, Method::kBatchedMemcpy},
                                               {Method::kMemcpyPerPiece, Method::kMemcpyPerPiece},
                                               {Method::kStaged, Method::kStaged},
                                               {Method::kStaged, Method::kKernel},
                                               {Method::kKernel, Method::kStaged}};
  for (const auto& [out_method, in_method] : methods)
  for (const auto& [k, v] : dtypes)
  for (const int32_t block_size : {4, 1})  // block size 1: pieces not multiples of 16 bytes
  for (const int32_t ctas : {0, 3}) {      // the copy kernel's grid uncapped, or capped (CTAs loop over blocks)
    SCOPED_TRACE(std::string(dtype_name(k)) + "/" + std::string(dtype_name(v)) + " methods " +
                 std::to_string(static_cast<int>(out_method)) + "/" + std::to_string(static_cast<int>(in_method)) +
                 " block size " + std::to_string(block_size) + " CTAs " + std::to_string(ctas));
    const KvPoolShape shape{3, 8, block_size, 2, 64, k, v};
    auto pool = CudaKvPool::create(shape);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    auto host = CudaHostKvPool::create(shape, 6);
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    (*host)->set_copy_method(kD2H, out_method);
    (*host)->set_copy_method(kH2D, in_method);
    (*host)->set_copy_kernel_ctas(ctas);
    EXPECT_EQ((*host)->block_bytes(), shape.bytes_per_token() * block_size);
    // Random bytes over the whole device pool (one allocation from layer 0's K codes).
    std::vector<uint8_t> noise((*pool)->total_bytes());
    std::mt19937 rng(5);
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    ASSERT_EQ(cudaMemcpy((*pool)->layer(0).key, noise.data(), noise.size(), cudaMemcpyHostToDevice), cudaSuccess);
    const auto b1 = device_block(**pool, 1), b2 = device_block(**pool, 2);
    ASSERT_NE(b1, b2);
    // Out and back, with a chain inside one list: 2 -> h0 -> 6, and 6 -> h3 -> 3.
    const std::vector<BlockTransfer> moves = {{kD2H, 1, 4}, {kD2H, 2, 0}, {kH2D, 5, 4},
                                              {kH2D, 6, 0}, {kD2H, 6, 3}, {kH2D, 3, 3}};
    ASSERT_TRUE((*host)->transfer(moves, **pool, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(std::memcmp((*host)->block(4), b1.data(), b1.size()), 0);
    EXPECT_EQ(device_block(**pool, 5), b1);
    EXPECT_EQ(device_block(**pool, 6), b2);
    EXPECT_EQ(device_block(**pool, 3), b2);
    const runtime::TransferStats stats = (*host)->stats();
    EXPECT_EQ(stats.blocks[0], 3);
    EXPECT_EQ(stats.blocks[1], 3);
    EXPECT_GT(stats.seconds[0], 0.0);
    EXPECT_GT(stats.seconds[1], 0.0);
  }
  cudaStreamDestroy(stream);
}

// A list of one batch goes layer by layer: the stream that waits for layer l's
// events (and nothing else) reads layer l of the loaded blocks whole, and a
// write-back in the same list leaves its block for the writes after it.
TEST(CudaHostTierTest, LayerByLayerLoadsAreReadyLayerByLayer) {
  PAGODA_SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& [dtype, block_size] : {std::pair{DType::kBF16, 16}, std::pair{DType::kFP8E4M3, 16},
                                          std::pair{DType::kInt4, 3}}) {
    SCOPED_TRACE(dtype_name(dtype));
    const KvPoolShape shape{6, 64, block_size, 4, 128, dtype, dtype};
    auto pool = CudaKvPool::create(shape);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    auto host = CudaHostKvPool::create(shape, 64);
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    std::vector<uint8_t> noise((*pool)->total_bytes());
    std::mt19937 rng(9);
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    ASSERT_EQ(cudaMemcpy((*pool)->layer(0).key, noise.data(), noise.size(), cudaMemcpyHostToDevice), cudaSuccess);
    // Blocks 0..31 out to host 0..31 (whole), then one list: host 0..31 into device 32..63, and device 0 to host 40.
    std::vector<BlockTransfer> out, mixed;
    std::vector<std::vector<std::byte>> expected;
    for (int32_t i = 0; i < 32; ++i) {
      out.push_back({kD2H, i, i});
      mixed.push_back({kH2D, 32 + i, i});
      expected.push_back(device_block(**pool, i));
    }
    mixed.push_back({kD2H, 0, 40});
    ASSERT_TRUE((*host)->transfer(out, **pool, stream).ok());
    auto went = (*host)->transfer_layered(mixed, **pool, stream);
    ASSERT_TRUE(went.ok()) << went.status().to_string();
    EXPECT_TRUE(*went);
    EXPECT_EQ((*host)->layered_calls(), 1);
    ASSERT_TRUE((*host)->layer_waits_pending());
    const KvLayerWaits waits = (*host)->take_layer_waits();
    EXPECT_FALSE((*host)->layer_waits_pending());
    ASSERT_EQ(waits.num_layers(), shape.num_layers);
    EXPECT_EQ(waits.per_layer, 2);
    // Layer by layer on `stream`: wait for the layer, read its pieces of every loaded block, then overwrite
    // block 0's pieces of that layer (the write-back must have read them first).
    std::vector<std::vector<std::byte>> got(32, std::vector<std::byte>(expected[0].size()));
    std::vector<std::vector<void*>> dsts(32);
    std::vector<std::vector<const void*>> srcs(32);
    std::vector<std::vector<size_t>> sizes(32);
    for (int32_t i = 0; i < 32; ++i)
      (*pool)->append_block_copies(32 + i, got[static_cast<size_t>(i)].data(), true, dsts[static_cast<size_t>(i)],
                                   srcs[static_cast<size_t>(i)], sizes[static_cast<size_t>(i)]);
    std::vector<void*> block0_dsts;
    std::vector<const void*> block0_srcs;
    std::vector<size_t> block0_sizes;
    std::vector<std::byte> zeros(expected[0].size());
    (*pool)->append_block_copies(0, zeros.data(), false, block0_dsts, block0_srcs, block0_sizes);
    const size_t per_layer = dsts[0].size() / static_cast<size_t>(shape.num_layers);
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      ASSERT_EQ(waits.wait_layer(stream, l), cudaSuccess);
      for (int32_t i = 0; i < 32; ++i)
        for (size_t p = l * per_layer; p < (l + 1) * per_layer; ++p)
          ASSERT_EQ(cudaMemcpyAsync(dsts[static_cast<size_t>(i)][p], srcs[static_cast<size_t>(i)][p],
                                    sizes[static_cast<size_t>(i)][p], cudaMemcpyDeviceToHost, stream),
                    cudaSuccess);
      for (size_t p = l * per_layer; p < (l + 1) * per_layer; ++p)
        ASSERT_EQ(cudaMemcpyAsync(block0_dsts[p], block0_srcs[p], block0_sizes[p], cudaMemcpyHostToDevice, stream),
                  cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int32_t i = 0; i < 32; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], expected[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(std::memcmp((*host)->block(40), expected[0].data(), expected[0].size()), 0);
    // A list of several batches (blocks touched twice: 5 -> h50 -> 6, then 7 -> h51 and h50 -> 7) goes layer
    // by layer in list order on one stream, one event per layer.
    const auto b5 = device_block(**pool, 5), b7 = device_block(**pool, 7);
    const std::vector<BlockTransfer> chain = {{kD2H, 5, 50}, {kH2D, 6, 50}, {kD2H, 7, 51}, {kH2D, 7, 50}};
    went = (*host)->transfer_layered(chain, **pool, stream);
    ASSERT_TRUE(went.ok());
    EXPECT_TRUE(*went);
    const KvLayerWaits chain_waits = (*host)->take_layer_waits();
    EXPECT_EQ(chain_waits.per_layer, 1);
    ASSERT_EQ(chain_waits.wait_all(stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(device_block(**pool, 6), b5);
    EXPECT_EQ(device_block(**pool, 7), b5);
    EXPECT_EQ(std::memcmp((*host)->block(51), b7.data(), b7.size()), 0);
    // With a DMA method the same list goes whole: nothing pending, the stream already waits.
    (*host)->set_copy_method(kH2D, CudaHostKvPool::CopyMethod::kStaged);
    went = (*host)->transfer_layered(chain, **pool, stream);
    ASSERT_TRUE(went.ok());
    EXPECT_FALSE(*went);
    EXPECT_FALSE((*host)->layer_waits_pending());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(device_block(**pool, 6), b5);
  }
  cudaStreamDestroy(stream);
}

std::filesystem::path fixture(const char* name) {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/models" / name;
}

class NoEosRunner final : public runtime::DelegatingModelRunner {
 public:
  using DelegatingModelRunner::DelegatingModelRunner;
  std::vector<int32_t> eos_token_ids() const override { return {}; }
};

std::unique_ptr<CudaModelRunner> make_runner(int32_t device_blocks, int32_t host_blocks, DType kv_dtype,
                                             int32_t block_size = 4) {
  CudaModelOptions options;
  options.max_num_seqs = 8;
  options.max_num_tokens = 256;
  options.max_model_len = 256;
  options.show_progress = false;
  options.kv_key_dtype = options.kv_value_dtype = kv_dtype;
  options.block_size = block_size;
  auto model = CudaModel::load(fixture("llama_f32"), options);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  CudaRunnerOptions runner_options;
  runner_options.num_blocks = device_blocks;
  runner_options.num_host_blocks = host_blocks;
  runner_options.print_report = false;
  auto r = CudaModelRunner::create(std::move(model).value(), runner_options);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

// Greedy tokens of `prompts` run through one engine: one at a time, or all at once.
std::vector<std::vector<int32_t>> generate(CudaModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                           bool together, engine::PreemptionMode mode, engine::EngineStats* stats,
                                           std::vector<int32_t>* cached = nullptr,
                                           kvstore::LowerTiers* lower_tiers = nullptr) {
  NoEosRunner seam(runner);
  kv::KvCacheConfig kc;
  kc.num_blocks = runner.kv_geometry().num_blocks;
  kc.block_size = runner.kv_geometry().block_size;
  kc.num_host_blocks = runner.capabilities().host_kv_blocks;
  if (lower_tiers != nullptr) {
    kc.stable_key_fingerprint = "cuda-host-tier-test/" + std::string(dtype_name(runner.kv_geometry().key_dtype)) +
                                "/" + std::to_string(kc.block_size);
    kc.host_write_through = true;
  }
  auto kv = std::move(kv::KvCacheManager::create(kc)).value();
  engine::EngineConfig ec;
  ec.lower_tiers = lower_tiers;
  ec.scheduler.max_running_sequences = together ? 8 : 1;
  ec.scheduler.max_tokens_per_step = 64;
  ec.scheduler.preemption_mode = mode;
  auto created = engine::Engine::create(ec, seam, *kv);
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  if (!created.ok()) return {};
  engine::Engine& eng = **created;
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  auto drive = [&](std::vector<std::pair<size_t, std::shared_ptr<engine::RequestStream>>> streams) {
    while (eng.step()) {
      const Status integrity = eng.verify_integrity();
      EXPECT_TRUE(integrity.ok()) << integrity.to_string();
    }
    for (auto& [i, s] : streams)
      while (auto out = s->next(std::chrono::milliseconds(0))) {
        for (const auto& c : out->choices) outputs[i].insert(outputs[i].end(), c.tokens.begin(), c.tokens.end());
        if (out->finished && cached) cached->push_back(out->usage.cached_tokens);
      }
  };
  std::vector<std::pair<size_t, std::shared_ptr<engine::RequestStream>>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::GenerationRequest r;
    r.prompt_tokens = prompts[i];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 12;
    auto s = eng.submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    streams.emplace_back(i, *s);
    if (!together) {
      drive(streams);
      streams.clear();
    }
  }
  drive(streams);
  if (stats) *stats = eng.stats();
  return outputs;
}

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 37 + salt * 101 + 11) % 256);
  return p;
}

TEST(CudaHostTierTest, AHostHitGivesTheMissOutputOnTheGpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kInt4})
  for (const auto& [layer_by_layer, ctas] : {std::pair{true, 0}, std::pair{false, 0}, std::pair{true, 2}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + (layer_by_layer ? " layer by layer" : " whole loads") +
                 " CTAs " + std::to_string(ctas));
    auto runner = make_runner(/*device_blocks=*/16, /*host_blocks=*/64, dtype);
    ASSERT_NE(runner, nullptr);
    runner->set_layer_by_layer(layer_by_layer);
    runner->host_pool()->set_copy_kernel_ctas(ctas);
    const auto prompt = prompt_of(41, 1);
    std::vector<int32_t> cached;
    engine::EngineStats stats;
    // The prompt, two others that crowd it out of the 16-block device pool, the prompt again.
    const auto out = generate(*runner, {prompt, prompt_of(41, 2), prompt_of(41, 3), prompt}, false,
                              engine::PreemptionMode::kRecompute, &stats, &cached);
    ASSERT_EQ(cached.size(), 4u);
    EXPECT_EQ(cached[0], 0);
    EXPECT_EQ(cached[3], 40) << "served from the host tier";
    EXPECT_EQ(out[3], out[0]);
    EXPECT_EQ(stats.kv.hit_tokens_by_tier[static_cast<int>(kv::BlockTier::kHost)], 40);
    EXPECT_GT(stats.transfers.blocks[static_cast<int>(kH2D)], 0);
    if (layer_by_layer) {
      EXPECT_GT(runner->host_pool()->layered_calls(), 0) << "the loads must go layer by layer";
    } else {
      EXPECT_EQ(runner->host_pool()->layered_calls(), 0);
    }
  }
}

TEST(CudaHostTierTest, PreemptionBySwapGivesTheOutputOfNoPreemptionOnTheGpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(prompt_of(20 + 2 * i, 10 + i));
  auto roomy = make_runner(256, 0, DType::kBF16);
  engine::EngineStats roomy_stats, tight_stats;
  const auto alone = generate(*roomy, prompts, false, engine::PreemptionMode::kRecompute, &roomy_stats);
  EXPECT_EQ(roomy_stats.preemptions, 0);
  auto tight = make_runner(24, 128, DType::kBF16);
  const auto swapped = generate(*tight, prompts, true, engine::PreemptionMode::kSwap, &tight_stats);
  EXPECT_GT(tight_stats.swap_preemptions, 0) << "the test must exercise swapping";
  // Batched with others the GPU's sums may round differently than alone; swap itself moves bytes exactly.
  int32_t same = 0;
  for (size_t i = 0; i < prompts.size(); ++i) same += swapped[i] == alone[i] ? 1 : 0;
  EXPECT_GE(same, static_cast<int32_t>(prompts.size()) - 1) << "at most one greedy tie may flip";
}

// The tiers below the host on the GPU: the engine spills the blocks a miss
// wrote (its spiller thread reads the pinned pool once the copy streams are
// done, while forwards run), and a fresh engine on the same runner, with its
// device and host pools overwritten with noise, loads them from disk through
// the host pool (write_host_block, then a host->device promotion layer by
// layer) and must produce the miss's greedy output.
TEST(CudaHostTierTest, ADiskTierHitGivesTheMissOutputOnTheGpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3})
  for (int32_t block_size : {16, 1}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " block size " + std::to_string(block_size));
    const int32_t device_blocks = 512 / block_size, host_blocks = 2048 / block_size;
    auto runner = make_runner(device_blocks, host_blocks, dtype, block_size);
    ASSERT_NE(runner, nullptr);
    const size_t block_bytes = runner->host_pool()->block_bytes();
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("pagoda_cuda_disk_tier_" + std::to_string(::getpid()) + "_" + std::to_string(block_size) + "_" +
         std::string(dtype_name(dtype)));
    std::filesystem::remove_all(dir);
    auto open_tiers = [&] {
      auto disk = kvstore::DiskTier::open({.dir = dir, .capacity_bytes = int64_t{1} << 30, .block_bytes = block_bytes});
      EXPECT_TRUE(disk.ok()) << disk.status().to_string();
      return disk.ok() ? std::make_unique<kvstore::LowerTiers>(block_bytes, std::move(*disk), nullptr) : nullptr;
    };
    // A prompt of 120 tokens and two others after it (their spills overlap forwards of the next request).
    const std::vector<std::vector<int32_t>> prompts = {prompt_of(120, 7), prompt_of(60, 8), prompt_of(90, 9)};
    const int32_t full_blocks = (120 - 1) / block_size;
    std::vector<std::vector<int32_t>> miss;
    {
      auto tiers = open_tiers();
      ASSERT_NE(tiers, nullptr);
      engine::EngineStats stats;
      miss = generate(*runner, prompts, false, engine::PreemptionMode::kRecompute, &stats, nullptr, tiers.get());
      ASSERT_EQ(miss.size(), prompts.size());
      tiers->flush();
      EXPECT_GE(tiers->stats()[0].blocks_written, full_blocks) << "the miss's blocks must reach the disk";
      EXPECT_EQ(tiers->stats()[0].writes_dropped, 0);
    }  // closed: the index is written
    // Noise over both pools: nothing of the first engine's K/V may be read by accident.
    std::vector<uint8_t> noise(runner->pool().total_bytes());
    std::mt19937 rng(17);
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    ASSERT_EQ(cudaMemcpy(runner->pool().layer(0).key, noise.data(), noise.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    std::memset(runner->host_pool()->block(0), 0x5a, runner->host_pool()->total_bytes());
    {
      auto tiers = open_tiers();
      ASSERT_NE(tiers, nullptr);
      engine::EngineStats stats;
      std::vector<int32_t> cached;
      const auto hit = generate(*runner, {prompts[0]}, false, engine::PreemptionMode::kRecompute, &stats, &cached,
                                tiers.get());
      ASSERT_EQ(cached.size(), 1u);
      EXPECT_EQ(cached[0], full_blocks * block_size) << "served from the disk tier";
      EXPECT_EQ(stats.kv.hit_tokens_by_lower_tier[0], full_blocks * block_size);
      EXPECT_EQ(stats.lower_tier_blocks_loaded, full_blocks);
      ASSERT_EQ(hit.size(), 1u);
      EXPECT_EQ(hit[0], miss[0]) << "a disk hit must give the miss's greedy output";
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace pagoda::cuda
