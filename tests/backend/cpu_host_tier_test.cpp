// The host tier on the CPU backend with the bundled model (models/pagoda-tiny):
// transfer_blocks moves every byte of a block (codes and scales) for every KV
// dtype; a host-tier hit gives the same greedy output as a miss at block sizes
// 16, 3 and 1 for f32, bf16, fp8, int8 and int4; and preemption by swap gives
// the same output as no preemption. KV invariants after every engine step.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/host_block_layout.h"

namespace pagoda {
namespace {

using runtime::BlockTransfer;
using runtime::TransferDirection;

std::shared_ptr<CpuModel> tiny_model() {
  static std::shared_ptr<CpuModel> model = [] {
    auto loaded = CpuModel::load(std::string(PAGODA_SOURCE_DIR) + "/models/pagoda-tiny");
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    return loaded.ok() ? std::shared_ptr<CpuModel>(std::move(*loaded)) : nullptr;
  }();
  return model;
}

const DType kKvDtypes[] = {DType::kF32, DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4};

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < length; ++i) p.push_back((i * 131 + salt * 977 + 7) % 4000 + 3);
  return p;
}

std::vector<std::byte> exported(const CpuModelRunner& runner, int32_t block) {
  std::vector<std::byte> bytes(runner.host_block_bytes());
  runner.pool().export_block(block, bytes.data());
  return bytes;
}

TEST(CpuHostTierTest, TransfersMoveEveryByteOfABlockForEveryKvDtype) {
  ASSERT_NE(tiny_model(), nullptr);
  for (DType dtype : kKvDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto runner = CpuModelRunner::create(tiny_model(), 8, 4, dtype, dtype == DType::kInt4 ? DType::kInt8 : dtype, 6);
    ASSERT_TRUE(runner.ok()) << runner.status().to_string();
    CpuModelRunner& r = **runner;
    EXPECT_EQ(r.capabilities().host_kv_blocks, 6);
    EXPECT_EQ(r.host_block_bytes(), r.kv_geometry().bytes_per_token() * 4) << "scales are part of a host block";
    EXPECT_EQ(runtime::host_block_layout(r.kv_geometry()).block_bytes(), r.host_block_bytes());
    // A forward writes K/V into blocks 1 and 2 (7 tokens).
    ForwardBatch batch;
    batch.token_ids = prompt_of(7, 1);
    for (int32_t i = 0; i < 7; ++i) batch.positions.push_back(i);
    batch.sequences.push_back(SequenceSlice{0, 7, 0, {1, 2}, false, true});
    ASSERT_TRUE(r.execute(batch, {}).ok());
    const std::vector<std::byte> block1 = exported(r, 1), block2 = exported(r, 2);
    ASSERT_NE(block1, exported(r, 5)) << "the forward wrote block 1";
    const std::vector<BlockTransfer> out = {{TransferDirection::kDeviceToHost, 1, 4},
                                            {TransferDirection::kDeviceToHost, 2, 0}};
    ASSERT_TRUE(r.transfer_blocks(out).ok());
    EXPECT_EQ(std::memcmp(r.host_block(4), block1.data(), block1.size()), 0);
    // Back into other device blocks, in order: 4 -> 5, then 0 -> 6 and 6 -> 3 (a later transfer reads an earlier one).
    const std::vector<BlockTransfer> in = {{TransferDirection::kHostToDevice, 5, 4},
                                           {TransferDirection::kHostToDevice, 6, 0},
                                           {TransferDirection::kDeviceToHost, 6, 3},
                                           {TransferDirection::kHostToDevice, 3, 3}};
    ASSERT_TRUE(r.transfer_blocks(in).ok());
    EXPECT_EQ(exported(r, 5), block1);
    EXPECT_EQ(exported(r, 6), block2);
    EXPECT_EQ(exported(r, 3), block2);
    const runtime::TransferStats stats = r.transfer_stats();
    EXPECT_EQ(stats.blocks[0], 3);
    EXPECT_EQ(stats.blocks[1], 3);
    EXPECT_EQ(stats.bytes[1], 3 * static_cast<int64_t>(r.host_block_bytes()));
  }
}

TEST(CpuHostTierTest, MlaLatentPoolsRoundTripThroughAHostChunk) {
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kInt4}) {
    SCOPED_TRACE(dtype_name(dtype));
    KvPoolShape shape{2, 5, 3, 1, 48, dtype, dtype};
    shape.latent = true;  // one latent vector per token, no V
    shape.latent_rope_dim = 8;
    auto pool = CpuKvPool::create(shape);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    const size_t block_bytes = runtime::host_block_layout(shape).block_bytes();
    EXPECT_EQ(block_bytes, shape.bytes_per_token() * 3) << "no V bytes in a latent host block";
    EXPECT_EQ(block_bytes * 5, pool->total_bytes());
    // Distinct bytes in every layer's latent codes and scales.
    const runtime::HostBlockLayout layout = runtime::host_block_layout(shape);
    for (int32_t l = 0; l < 2; ++l) {
      const kernels::PagedKvLayer view = pool->layer(l);
      EXPECT_EQ(view.value, nullptr);
      auto* codes = static_cast<uint8_t*>(view.key);
      for (size_t i = 0; i < 5 * layout.segment_bytes[runtime::kKeyCodes]; ++i) codes[i] = static_cast<uint8_t>(i * 7 + l);
      if (view.key_scales == nullptr) continue;
      auto* scales = static_cast<uint8_t*>(view.key_scales);
      for (size_t i = 0; i < 5 * layout.segment_bytes[runtime::kKeyScales]; ++i)
        scales[i] = static_cast<uint8_t>(i * 13 + l + 1);
    }
    std::vector<std::byte> chunk(block_bytes), again(block_bytes);
    pool->export_block(1, chunk.data());
    pool->import_block(3, chunk.data());
    pool->export_block(3, again.data());
    EXPECT_EQ(again, chunk);
    std::vector<std::byte> other(block_bytes);
    pool->export_block(2, other.data());
    EXPECT_NE(other, chunk);
  }
}

TEST(CpuHostTierTest, BadTransfersAreRefusedBeforeAnythingMoves) {
  ASSERT_NE(tiny_model(), nullptr);
  auto runner = CpuModelRunner::create(tiny_model(), 4, 4, DType::kF32, DType::kF32, 2);
  ASSERT_TRUE(runner.ok());
  const std::vector<std::byte> before = exported(**runner, 0);
  const std::vector<BlockTransfer> bad = {{TransferDirection::kHostToDevice, 0, 1},
                                          {TransferDirection::kHostToDevice, 0, 2}};
  const Status s = (*runner)->transfer_blocks(bad);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("host blocks"), std::string::npos) << s.message();
  EXPECT_EQ(exported(**runner, 0), before) << "nothing moved";
  auto plain = CpuModelRunner::create(tiny_model(), 4, 4);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->transfer_blocks(bad).code(), StatusCode::kUnimplemented);
  EXPECT_TRUE((*plain)->transfer_blocks({}).ok());
  EXPECT_EQ(CpuModelRunner::create(tiny_model(), 4, 4, DType::kF32, DType::kF32, -1).status().code(),
            StatusCode::kInvalidArgument);
}

// The engine over the tiny model with a host tier.
struct TieredEngine {
  TieredEngine(DType dtype, int32_t block_size, int32_t device_blocks, int32_t host_blocks,
               engine::PreemptionMode mode = engine::PreemptionMode::kRecompute, int32_t max_running = 8) {
    auto created = CpuModelRunner::create(tiny_model(), device_blocks, block_size, dtype, dtype, host_blocks);
    EXPECT_TRUE(created.ok()) << created.status().to_string();
    runner = std::move(*created);
    kv::KvCacheConfig kc;
    kc.num_blocks = device_blocks;
    kc.block_size = block_size;
    kc.num_host_blocks = host_blocks;
    kv = std::move(kv::KvCacheManager::create(kc)).value();
    engine::EngineConfig ec;
    ec.scheduler.preemption_mode = mode;
    ec.scheduler.max_running_sequences = max_running;
    ec.scheduler.max_tokens_per_step = 64;
    eng = std::move(engine::Engine::create(ec, *runner, *kv)).value();
  }
  // Submits every prompt at once, steps until idle with integrity checks, returns the tokens.
  std::vector<std::vector<int32_t>> run(const std::vector<std::vector<int32_t>>& prompts, int32_t max_tokens,
                                        std::vector<int32_t>* cached = nullptr) {
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (const auto& p : prompts) {
      engine::GenerationRequest r;
      r.prompt_tokens = p;
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = max_tokens;
      r.sampling.ignore_eos = true;
      auto s = eng->submit(std::move(r));
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      streams.push_back(*s);
    }
    while (eng->step()) {
      const Status integrity = eng->verify_integrity();
      EXPECT_TRUE(integrity.ok()) << integrity.to_string();
      if (!integrity.ok()) break;
    }
    std::vector<std::vector<int32_t>> outputs;
    for (auto& s : streams) {
      std::vector<int32_t> tokens;
      while (auto out = s->next(std::chrono::milliseconds(0))) {
        for (const auto& c : out->choices) tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
        EXPECT_TRUE(out->error.empty()) << out->error;
        if (out->finished && cached) cached->push_back(out->usage.cached_tokens);
      }
      outputs.push_back(std::move(tokens));
    }
    return outputs;
  }
  std::unique_ptr<CpuModelRunner> runner;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<engine::Engine> eng;
};

TEST(CpuHostTierTest, AHostHitGivesTheSameGreedyOutputAsAMissAtEveryBlockSizeAndKvDtype) {
  // Equality holds on the f32-exact GEMM path: the default bf16 prefill GEMM runs the miss's 48-token
  // chunk, while a hit at block size 3 or 1 recomputes its last tokens through decode's exact path, and
  // on this synthetic prompt a near tie (fp8 KV) flips with that rounding (docs/CPU_QUANT.md). Pinned.
  const kernels::ScopedBf16Gemm exact(false);
  ASSERT_NE(tiny_model(), nullptr);
  for (const int32_t bs : {16, 3, 1}) {
    for (DType dtype : kKvDtypes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " block size " + std::to_string(bs));
      // The device holds about one 48-token conversation; the host tier many.
      const int32_t device_blocks = (64 + bs - 1) / bs + 1;
      TieredEngine t(dtype, bs, device_blocks, 8 * device_blocks);
      const std::vector<int32_t> prompt = prompt_of(48, 1);
      std::vector<int32_t> cached;
      const auto miss = t.run({prompt}, 8, &cached);
      for (int i = 0; i < 2; ++i) t.run({prompt_of(48, 2 + i)}, 8);  // crowd the prompt out of the device
      ASSERT_EQ(t.kv->match_prefix("", prompt).host_blocks * bs, 47 / bs * bs) << "all of it in the host tier";
      const auto hit = t.run({prompt}, 8, &cached);
      ASSERT_EQ(cached.size(), 2u);
      EXPECT_EQ(cached[0], 0);
      EXPECT_EQ(cached[1], 47 / bs * bs);
      EXPECT_EQ(hit, miss);
      const engine::EngineStats stats = t.eng->stats();
      EXPECT_EQ(stats.kv.hit_tokens_by_tier[static_cast<int>(kv::BlockTier::kHost)], 47 / bs * bs);
      EXPECT_GT(stats.transfers.blocks[static_cast<int>(TransferDirection::kHostToDevice)], 0);
      EXPECT_GT(stats.transfers.bytes[static_cast<int>(TransferDirection::kDeviceToHost)], 0);
    }
  }
}

TEST(CpuHostTierTest, PreemptionBySwapGivesTheSameOutputAsNoPreemption) {
  // Token-for-token equality across schedules holds on the f32-exact GEMM path: with the default bf16
  // prefill GEMM a token's logits through a prefill chunk and through decode differ within the bf16 bound
  // (docs/CPU_QUANT.md), so a near tie can flip when the schedule changes the chunking. Pinned.
  const kernels::ScopedBf16Gemm exact(false);
  ASSERT_NE(tiny_model(), nullptr);
  for (DType dtype : {DType::kF32, DType::kInt4}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) prompts.push_back(prompt_of(20 + 3 * i, 10 + i));
    // One at a time in a roomy pool: no preemption, no batching.
    std::vector<std::vector<int32_t>> alone;
    TieredEngine roomy(dtype, 4, 128, 0, engine::PreemptionMode::kRecompute, 1);
    for (const auto& p : prompts) alone.push_back(roomy.run({p}, 24)[0]);
    EXPECT_EQ(roomy.eng->stats().preemptions, 0);
    // Together in 20 blocks (4 x ~12 needed): preempted by swap.
    TieredEngine tight(dtype, 4, 20, 64, engine::PreemptionMode::kSwap, 4);
    EXPECT_EQ(tight.run(prompts, 24), alone);
    const engine::EngineStats stats = tight.eng->stats();
    EXPECT_GT(stats.swap_preemptions, 0) << "the test must exercise swapping";
    EXPECT_EQ(stats.swap_preemptions, stats.preemptions);
    EXPECT_GT(stats.kv.swap_ins, 0);
  }
}

}  // namespace
}  // namespace pagoda
