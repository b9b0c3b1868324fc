// Token eviction on the CUDA runner (docs/KV_CACHE.md "Token eviction"), streaming:
//  - the compaction gather (kv_compact.h) writes the same bytes as the CPU
//    compaction (CpuKvEviction::compact) on the same pool contents, in every KV dtype;
//  - through the engine: at full budget streaming's output is identical to none;
//    under a budget the cache is compacted and no block leaks;
//  - a scored policy is refused by name (this device has no attention scores yet).

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cpu/cpu_kv_eviction.h"
#include "pagoda/backend/cpu/cpu_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda::cuda {
namespace {

using namespace std::chrono_literals;

std::filesystem::path fixture(const char* name) {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/models" / name;
}

std::unique_ptr<CudaModelRunner> make_runner(DType kv_dtype, int32_t num_blocks = 128) {
  CudaModelOptions options;
  options.max_num_seqs = 8;
  options.max_num_tokens = 512;
  options.max_model_len = 512;
  options.show_progress = false;
  options.kv_key_dtype = options.kv_value_dtype = kv_dtype;
  auto model = CudaModel::load(fixture("llama_f32"), options);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return nullptr;
  CudaRunnerOptions runner_options;
  runner_options.num_blocks = num_blocks;
  runner_options.print_report = false;
  auto r = CudaModelRunner::create(std::move(model).value(), runner_options);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

runtime::KvCompressionConfig streaming(int32_t budget, int32_t sinks = 4, int32_t window = 16) {
  runtime::KvCompressionConfig c;
  c.policy = runtime::KvCompressionPolicy::kStreaming;
  c.budget = budget;
  c.sink_tokens = sinks;
  c.window = window;
  return c;
}

// The byte ranges of one layer's four sub-pools (K codes, V codes, K scales, V scales).
struct Segment {
  void* device = nullptr;
  std::byte* host = nullptr;
  size_t bytes = 0;
};
std::vector<Segment> segments(const DevicePagedKvLayer& d, const kernels::PagedKvLayer& h, DType k, DType v) {
  const size_t vectors = static_cast<size_t>(h.num_blocks) * h.block_size * h.num_kv_heads;
  return {{d.key, static_cast<std::byte*>(h.key), vectors * kernels::kv_head_bytes(h.head_dim, k)},
          {d.value, static_cast<std::byte*>(h.value), vectors * kernels::kv_head_bytes(h.head_dim, v)},
          {d.key_scale, static_cast<std::byte*>(h.key_scales), vectors * kernels::kv_head_scale_bytes(h.head_dim, k)},
          {d.value_scale, static_cast<std::byte*>(h.value_scales),
           vectors * kernels::kv_head_scale_bytes(h.head_dim, v)}};
}

TEST(KvEvictionGpu, CompactionWritesTheCpuCompactionsBytes) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kInt8, DType::kInt4}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto runner = make_runner(dtype, 32);
    ASSERT_NE(runner, nullptr);
    const KvPoolShape shape = runner->kv_geometry();
    auto cpu = CpuKvPool::create(shape);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    // The same random bytes in both pools (any bytes: the compaction moves them as they are).
    std::mt19937 rng(11);
    for (int32_t l = 0; l < shape.num_layers; ++l)
      for (const Segment& s : segments(runner->pool().layer(l), cpu->layer(l), shape.key_dtype, shape.value_dtype)) {
        if (s.bytes == 0) continue;
        ASSERT_NE(s.device, nullptr);
        for (size_t i = 0; i < s.bytes; ++i) s.host[i] = static_cast<std::byte>(rng() & 0xff);
        ASSERT_EQ(cudaMemcpy(s.device, s.host, s.bytes, cudaMemcpyHostToDevice), cudaSuccess);
      }
    runtime::KvCompaction job;
    job.kv_state = 3;
    job.config = streaming(40, 4, 8);
    job.old_block_table = {9, 1, 4, 12, 6, 3, 20, 17};  // 8 blocks of 16: 120 tokens
    job.old_length = 120;
    job.new_block_table = {0, 2, 5};
    job.new_length = 40;
    ASSERT_TRUE(runner->compact_kv(job).ok());
    CpuKvEviction reference(shape.num_layers, shape.num_kv_heads);
    ASSERT_TRUE(reference.compact(job, *cpu).ok());
    for (int32_t l = 0; l < shape.num_layers; ++l)
      for (const Segment& s : segments(runner->pool().layer(l), cpu->layer(l), shape.key_dtype, shape.value_dtype)) {
        if (s.bytes == 0) continue;
        std::vector<std::byte> gpu(s.bytes);
        ASSERT_EQ(cudaMemcpy(gpu.data(), s.device, s.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(std::memcmp(gpu.data(), s.host, s.bytes), 0) << "layer " << l;
      }
    // Bad jobs are refused before anything moves; a scored policy by name.
    runtime::KvCompaction overlap = job;
    overlap.new_block_table = {0, 9, 5};
    EXPECT_EQ(runner->compact_kv(overlap).code(), StatusCode::kInvalidArgument);
    runtime::KvCompaction snap = job;
    snap.config.policy = runtime::KvCompressionPolicy::kSnapKV;
    EXPECT_EQ(runner->compact_kv(snap).code(), StatusCode::kUnimplemented);
  }
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  engine::EngineStats stats;
  std::string error;
};

GreedyRun run_greedy(CudaModelRunner& runner, const std::vector<int32_t>& prompt, int32_t max_tokens,
               const runtime::KvCompressionConfig& compression) {
  kv::KvCacheConfig kc;
  kc.num_blocks = runner.kv_geometry().num_blocks;
  kc.block_size = runner.kv_geometry().block_size;
  auto kv = kv::KvCacheManager::create(kc);
  EXPECT_TRUE(kv.ok());
  engine::EngineConfig ec;
  ec.scheduler.max_tokens_per_step = 128;
  ec.kv_compression = compression;
  engine::Engine eng(ec, runner, **kv);
  engine::GenerationRequest r;
  r.prompt_tokens = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  GreedyRun out;
  auto stream = eng.submit(r);
  if (!stream.ok()) {
    out.error = stream.status().to_string();
    return out;
  }
  int guard = 0;
  while (eng.step()) {
    EXPECT_TRUE(eng.verify_integrity().ok());
    if (++guard > 10000) break;
  }
  while (auto d = (*stream)->next(0ms)) {
    for (const auto& c : d->choices) out.tokens.insert(out.tokens.end(), c.tokens.begin(), c.tokens.end());
    if (d->finished) out.error = d->error;
  }
  out.stats = eng.stats();
  EXPECT_EQ((*kv)->num_available_blocks(), kc.num_blocks) << "blocks leaked";
  return out;
}

std::vector<int32_t> prompt_of(int32_t length, int32_t salt) {
  std::vector<int32_t> p(length);
  for (int32_t i = 0; i < length; ++i) p[i] = (i * 37 + salt * 101 + 7) % 256;
  return p;
}

TEST(KvEvictionGpu, StreamingThroughTheEngine) {
  PAGODA_SKIP_WITHOUT_GPU();
  auto runner = make_runner(DType::kBF16);
  ASSERT_NE(runner, nullptr);
  const std::vector<int32_t> prompt = prompt_of(150, 1);
  const GreedyRun none = run_greedy(*runner, prompt, 40, {});
  ASSERT_EQ(none.tokens.size(), 40u) << none.error;
  // Full budget: never compacted, the same output.
  const GreedyRun full = run_greedy(*runner, prompt, 40, streaming(200));
  EXPECT_EQ(full.tokens, none.tokens);
  EXPECT_EQ(full.stats.kv_compactions, 0);
  // Under a budget: compacted after the prompt and then once per block of decode.
  const GreedyRun small = run_greedy(*runner, prompt, 60, streaming(64));
  EXPECT_TRUE(small.error.empty()) << small.error;
  EXPECT_EQ(small.tokens.size(), 60u);
  EXPECT_GE(small.stats.kv_compactions, 2);
  EXPECT_GT(small.stats.kv_evicted_slots, 150 - 64);
  // A scored policy is refused by name at submission.
  runtime::KvCompressionConfig snap = streaming(64);
  snap.policy = runtime::KvCompressionPolicy::kSnapKV;
  const GreedyRun refused = run_greedy(*runner, prompt, 4, snap);
  EXPECT_NE(refused.error.find("--kv-compression snapkv"), std::string::npos) << refused.error;
}

}  // namespace
}  // namespace pagoda::cuda
