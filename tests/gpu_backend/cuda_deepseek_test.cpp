// DeepSeek V2/V3 (MLA + MoE) on the GPU against the CPU reference model
// (CpuModel, f32 compute, the same latent dtype) on the committed transformers
// fixtures, at block sizes 16 and 1 and with bf16 and fp8 latent pools; and
// the GPU random DeepSeek model against the CPU one made from the same recipe.
//
// The measure is transformers' own (expected.json's bf16_gpu_max_top5_logprob_error):
// the largest |logprob difference| over the reference's top-5 tokens of every
// row. These tiny random MoE models are sensitive (a router flip moves a row a
// lot): transformers in bf16 differs from its own f32 by up to 1.22 on them, so
// the bound is the fixture's own bf16 spread with headroom (kSpreadFactor,
// floor kMinBound). With an fp8 latent the GPU's codes come from bf16
// activations and the CPU's from f32 ones, and one fp8 code step (6 %) moves
// these models as far as fp8 itself does: the fp8 bound adds what an fp8
// latent does to the CPU reference on the fixture (fp8_spread, measured by
// deepseek_reference_test, docs/MLA.md). Greedy tokens must equal the CPU's wherever the CPU's top-1
// margin exceeds twice the step's measured error (a flip is impossible
// there), and the free-running greedy run is reported against transformers'.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu_test_support.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/random_deepseek_model.h"
#include "pagoda/backend/cuda/cuda_kv_pool.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/mla_ops.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/mla_fp8_layout.h"
#include "pagoda/runtime/mla_latent_layout.h"

namespace pagoda::cuda {
namespace {

constexpr int32_t kNumBlocks = 300;  // three sequences of 64 tokens at block size 1, 100 apart
constexpr double kSpreadFactor = 2.0;
constexpr double kMinBound = 0.15;

// How far an fp8 latent moves the CPU reference on the fixture: the largest
// |top-5 logprob error| against transformers' f32 outputs over the two fp8
// latent formats measured on the CPU (the per-vector 580-byte one and the
// 656-byte records the pool stores now; docs/MLA.md, "Quantized latent
// caches"). Each is one fp8-sized perturbation of these sensitive models, and
// which steps it flips depends on the codes, which the GPU's bf16 activations
// change.
double fp8_spread(const std::string& fixture) {
  if (fixture == "deepseek_v2_lite_bf16") return 0.264;
  if (fixture == "deepseek_v2_group_yarn_f32") return 1.51;
  if (fixture == "deepseek_v3_bf16") return 2.40;
  if (fixture == "deepseek_v3_latent512_bf16") return 1.256;
  return 0.0;
}

std::filesystem::path fixtures_dir() {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/models";
}

struct Expected {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::vector<double> margin;
  double bf16_spread = 0.0;
};

Expected load_expected(const std::filesystem::path& dir) {
  std::ifstream in(dir / "expected.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  return Expected{j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("greedy_tokens").get<std::vector<int32_t>>(),
                  j.at("top1_margin").get<std::vector<double>>(),
                  j.at("bf16_gpu_max_top5_logprob_error").get<double>()};
}

std::vector<int32_t> blocks_from(int32_t first, int32_t count) {
  std::vector<int32_t> blocks(static_cast<size_t>(count));
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

ForwardBatch single(const std::vector<int32_t>& tokens, int32_t cached, std::vector<int32_t> table, bool all_logits) {
  ForwardBatch b;
  b.token_ids = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(cached + static_cast<int32_t>(i));
  SequenceSlice s;
  s.token_offset = 0;
  s.num_new_tokens = static_cast<int32_t>(tokens.size());
  s.num_cached_tokens = cached;
  s.block_table = std::move(table);
  s.logits_for_all_new_tokens = all_logits;
  b.sequences.push_back(std::move(s));
  return b;
}

std::vector<double> log_softmax(const float* row, int32_t n) {
  const double mx = *std::max_element(row, row + n);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = row[i] - lse;
  return out;
}

// max over rows of max |gpu - cpu| logprob over the CPU row's top-5 tokens (NaN: huge).
double top5_logprob_error(const std::vector<float>& gpu, const std::vector<float>& cpu, int32_t vocab) {
  double worst = 0;
  for (size_t r = 0; r * vocab < cpu.size(); ++r) {
    const std::vector<double> a = log_softmax(gpu.data() + r * vocab, vocab);
    const std::vector<double> b = log_softmax(cpu.data() + r * vocab, vocab);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int32_t x, int32_t y) { return b[x] > b[y]; });
    for (int k = 0; k < 5; ++k) {
      const double d = std::abs(a[order[k]] - b[order[k]]);
      worst = std::isnan(d) ? 1e30 : std::max(worst, d);
    }
  }
  return worst;
}

int32_t argmax(const float* row, int32_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

double top1_margin(const float* row, int32_t n) {
  std::vector<float> v(row, row + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return static_cast<double>(v[0]) - v[1];
}

CudaModelOptions options_for(int32_t block_size, DType latent) {
  CudaModelOptions o;
  o.max_num_tokens = 256;
  o.max_num_seqs = 8;
  o.max_model_len = 128;
  o.block_size = block_size;
  o.show_progress = false;
  o.kv_key_dtype = o.kv_value_dtype = latent;
  return o;
}

using Param = std::tuple<std::string, int32_t, DType>;

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_block" + std::to_string(std::get<1>(info.param)) + "_" +
         std::string(std::get<2>(info.param) == DType::kBF16 ? "bf16" : "fp8");
}

class DeepseekFixtureTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    PAGODA_SKIP_WITHOUT_GPU();
    const auto& [name, block_size, latent] = GetParam();
    dir_ = fixtures_dir() / name;
    expected_ = load_expected(dir_);
    block_size_ = block_size;
    bound_ = std::max(kMinBound, kSpreadFactor * expected_.bf16_spread) +
             (latent == DType::kFP8E4M3 ? fp8_spread(name) : 0.0);
    auto cpu = CpuModel::load(dir_);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    cpu_ = std::move(cpu).value();
    // The CPU reference keeps f32 latents for a bf16 GPU pool, and the same fp8 format for fp8.
    const DType cpu_latent = latent == DType::kBF16 ? DType::kF32 : latent;
    auto cpu_pool = CpuKvPool::create(cpu_->kv_pool_shape(kNumBlocks, block_size, cpu_latent, cpu_latent));
    ASSERT_TRUE(cpu_pool.ok()) << cpu_pool.status().to_string();
    cpu_pool_ = std::make_unique<CpuKvPool>(std::move(cpu_pool).value());
    auto gpu = CudaModel::load(dir_, options_for(block_size, latent));
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    gpu_ = std::move(gpu).value();
    const KvPoolShape shape = gpu_->kv_pool_shape(kNumBlocks);
    EXPECT_TRUE(shape.latent);
    EXPECT_EQ(shape.num_kv_heads, 1);
    EXPECT_EQ(shape.head_dim, gpu_->config().mla->latent_dim());
    auto pool = CudaKvPool::create(shape);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    pool_ = std::move(pool).value();
  }
  std::string name() const { return param_name(::testing::TestParamInfo<Param>(GetParam(), 0)); }
  // Blocks for a sequence of up to 64 tokens.
  std::vector<int32_t> table(int32_t first) const { return blocks_from(first, (64 + block_size_ - 1) / block_size_); }

  std::filesystem::path dir_;
  Expected expected_;
  int32_t block_size_ = 16;
  double bound_ = 0;
  std::unique_ptr<CpuModel> cpu_;
  std::unique_ptr<CpuKvPool> cpu_pool_;
  std::unique_ptr<CudaModel> gpu_;
  std::unique_ptr<CudaKvPool> pool_;
};

TEST_P(DeepseekFixtureTest, PrefillAndTeacherForcedDecodeMatchCpu) {
  const int32_t vocab = gpu_->config().vocab_size;
  std::vector<float> want, got;
  ASSERT_TRUE(cpu_->forward(single(expected_.prompt, 0, table(0), true), *cpu_pool_, want).ok());
  const Status s = gpu_->forward(single(expected_.prompt, 0, table(0), true), *pool_, got);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(got.size(), want.size());
  const double prefill_error = top5_logprob_error(got, want, vocab);
  EXPECT_LE(prefill_error, bound_) << "prefill";

  // Decode along transformers' greedy tokens; the last prefill row is step 0.
  want.erase(want.begin(), want.end() - vocab);
  got.erase(got.begin(), got.end() - vocab);
  int32_t length = static_cast<int32_t>(expected_.prompt.size());
  double worst = prefill_error;
  int checked = 0;
  for (size_t step = 0; step < expected_.greedy.size(); ++step) {
    const double error = top5_logprob_error(got, want, vocab);
    worst = std::max(worst, error);
    EXPECT_LE(error, bound_) << "step " << step;
    if (top1_margin(want.data(), vocab) > 2 * error) {
      EXPECT_EQ(argmax(got.data(), vocab), argmax(want.data(), vocab)) << "step " << step;
      ++checked;
    }
    if (step + 1 == expected_.greedy.size()) break;
    const ForwardBatch next = single({expected_.greedy[step]}, length++, table(0), false);
    ASSERT_TRUE(cpu_->forward(next, *cpu_pool_, want).ok());
    const Status d = gpu_->forward(next, *pool_, got);
    ASSERT_TRUE(d.ok()) << d.to_string();
  }
  std::cout << "[ figure ] " << name() << ": max top-5 logprob |gpu - cpu| prefill "
            << prefill_error << ", over prefill + " << expected_.greedy.size() << " decode steps " << worst
            << " (bound " << bound_ << ", transformers bf16 spread " << expected_.bf16_spread << "); greedy equal to "
            << "the CPU at " << checked << " steps where its margin > 2 x error\n";
}

// A figure printer, not a check (run with --gtest_also_run_disabled_tests): the
// fixture prompts are shorter than CudaMlaPrefill's min_rows, so the test
// above runs them on the simple kernel; here they run on the tensor-core
// prefill (min_rows 1), and each prompt row's error against the CPU is printed
// beside the simple kernel's, with the two paths' own difference.
TEST_P(DeepseekFixtureTest, DISABLED_TensorCorePrefillRowsAgainstCpu) {
  const int32_t vocab = gpu_->config().vocab_size;
  std::vector<float> want, prefill, simple;
  ASSERT_TRUE(cpu_->forward(single(expected_.prompt, 0, table(0), true), *cpu_pool_, want).ok());
  CudaMlaPrefill::Tuning tuning;
  tuning.min_rows = 1;
  gpu_->set_mla_prefill_tuning(tuning);
  ASSERT_TRUE(gpu_->forward(single(expected_.prompt, 0, table(0), true), *pool_, prefill).ok());
  EXPECT_EQ(gpu_->mla_prefill_steps(), 1);
  gpu_->set_fast_attention(false);
  ASSERT_TRUE(gpu_->forward(single(expected_.prompt, 0, table(0), true), *pool_, simple).ok());
  auto row = [&](const std::vector<float>& v, size_t r) {
    return std::vector<float>(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
  };
  std::ostringstream rows;
  for (size_t r = 0; r * vocab < want.size(); ++r) {
    rows << " " << r << ":" << top5_logprob_error(row(prefill, r), row(want, r), vocab) << "/"
         << top5_logprob_error(row(simple, r), row(want, r), vocab) << "/"
         << top5_logprob_error(row(prefill, r), row(simple, r), vocab);
  }
  std::cout << "[ figure ] " << name() << " prompt rows, error vs CPU (tensor-core prefill / simple kernel / "
            << "prefill vs simple):" << rows.str() << "\n";
}

TEST_P(DeepseekFixtureTest, FreeRunningGreedyAgainstTransformers) {
  std::vector<int32_t> tokens;
  ASSERT_TRUE(gpu_->forward_greedy(single(expected_.prompt, 0, table(0), false), *pool_, tokens).ok());
  int32_t length = static_cast<int32_t>(expected_.prompt.size());
  size_t agreed = 0;
  for (size_t step = 0; step < expected_.greedy.size(); ++step) {
    ASSERT_EQ(tokens.size(), 1u);
    if (tokens[0] != expected_.greedy[step]) {
      // Only a step whose transformers margin is within the bf16 spread may diverge.
      EXPECT_LE(expected_.margin[step], 2 * bound_) << "step " << step << ": got " << tokens[0] << ", want "
                                                    << expected_.greedy[step];
      break;
    }
    ++agreed;
    ASSERT_TRUE(gpu_->forward_greedy(single({tokens[0]}, length++, table(0), false), *pool_, tokens).ok());
  }
  std::cout << "[ figure ] " << name() << " free-running greedy: " << agreed << "/"
            << expected_.greedy.size() << " tokens equal to transformers'\n";
}

TEST_P(DeepseekFixtureTest, BatchOfSequencesAndChunkedPrefillMatchSingleRuns) {
  // Three sequences: one prefilled in two chunks, two at once in one batch with a decode step after.
  const int32_t vocab = gpu_->config().vocab_size;
  const std::vector<int32_t>& p = expected_.prompt;
  const int32_t n = static_cast<int32_t>(p.size());
  std::vector<float> whole, part, unused;
  ASSERT_TRUE(gpu_->forward(single(p, 0, table(0), false), *pool_, whole).ok());
  const int32_t split = n / 2 + 1;
  ASSERT_TRUE(gpu_->forward(single({p.begin(), p.begin() + split}, 0, table(100), false), *pool_, unused).ok());
  ASSERT_TRUE(gpu_->forward(single({p.begin() + split, p.end()}, split, table(100), false), *pool_, part).ok());
  ASSERT_EQ(part.size(), whole.size());
  // GEMMs of other row counts may round differently in bf16 (and a router may flip on that): the bf16 bound.
  const double chunked = top5_logprob_error(part, whole, vocab);
  EXPECT_LE(chunked, bound_) << "chunked prefill vs one shot";

  ForwardBatch batch;
  const std::vector<int32_t> lengths = {n, n - 5};
  for (int s = 0; s < 2; ++s) {
    SequenceSlice slice;
    slice.token_offset = static_cast<int32_t>(batch.token_ids.size());
    slice.num_new_tokens = lengths[s];
    slice.block_table = table(s == 0 ? 100 : 200);
    for (int32_t i = 0; i < lengths[s]; ++i) {
      batch.token_ids.push_back(p[i]);
      batch.positions.push_back(i);
    }
    batch.sequences.push_back(slice);
  }
  std::vector<float> both, alone;
  ASSERT_TRUE(gpu_->forward(batch, *pool_, both).ok());
  ASSERT_TRUE(gpu_->forward(single({p.begin(), p.begin() + lengths[1]}, 0, table(0), false), *pool_, alone).ok());
  ASSERT_EQ(both.size(), 2u * vocab);
  const double first = top5_logprob_error({both.begin(), both.begin() + vocab}, whole, vocab);
  const double second = top5_logprob_error({both.begin() + vocab, both.end()}, alone, vocab);
  EXPECT_LE(first, bound_);
  EXPECT_LE(second, bound_);
  std::cout << "[ figure ] " << name()
            << ": chunked vs one-shot prefill " << chunked << ", batched vs alone " << first << " / " << second << "\n";
}

TEST_P(DeepseekFixtureTest, CopiedBlocksContinueTheSequence) {
  // Copy-on-write on the latent pool: the prompt's blocks copied elsewhere give the same next step.
  const int32_t n = static_cast<int32_t>(expected_.prompt.size());
  std::vector<float> unused, a, b;
  ASSERT_TRUE(gpu_->forward(single(expected_.prompt, 0, table(0), false), *pool_, unused).ok());
  const int32_t used = (n + block_size_ - 1) / block_size_;
  std::vector<runtime::BlockCopy> copies;
  for (int32_t i = 0; i < used; ++i) copies.push_back({i, 100 + i});
  ASSERT_TRUE(pool_->copy_blocks(copies, gpu_->stream()).ok());
  ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
  ASSERT_TRUE(gpu_->forward(single({expected_.greedy[0]}, n, table(0), false), *pool_, a).ok());
  ASSERT_TRUE(gpu_->forward(single({expected_.greedy[0]}, n, table(100), false), *pool_, b).ok());
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekFixtureTest,
                         ::testing::Combine(::testing::Values("deepseek_v2_lite_bf16", "deepseek_v2_group_yarn_f32",
                                                              "deepseek_v3_bf16", "deepseek_v3_latent512_bf16"),
                                            ::testing::Values(16, 1),
                                            ::testing::Values(DType::kBF16, DType::kFP8E4M3)),
                         param_name);

TEST(CudaDeepseek, LatentPoolHasNoValueSegments) {
  PAGODA_SKIP_WITHOUT_GPU();
  KvPoolShape shape{2, 4, 16, 1, 576, DType::kFP8E4M3, DType::kFP8E4M3, true};
  shape.latent_rope_dim = 64;
  EXPECT_EQ(shape.bytes_per_token(), 2u * 656u);  // FlashMLA's fp8 record per token and layer
  auto pool = CudaKvPool::create(shape);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  const DevicePagedKvLayer layer = (*pool)->layer(1);
  EXPECT_NE(layer.key, nullptr);
  EXPECT_EQ(layer.key_scale, nullptr);  // the records hold their scales
  EXPECT_EQ(layer.value, nullptr);
  EXPECT_EQ(layer.value_scale, nullptr);
  EXPECT_GE((*pool)->total_bytes(), shape.bytes_per_token() * 4 * 16);
  EXPECT_LT((*pool)->total_bytes(), shape.bytes_per_token() * 4 * 16 + 4 * 256);
}

// The GPU latent write into an fp8 pool stores runtime/mla_fp8_layout.h's records
// as the CPU reference does (identity rope, unit norm weights, so the input of
// the quantizer is known on the host): the same scales (to f32 rounding of the
// norm), codes within one step, the rope bf16 and the padding zero byte for
// byte; the prefill gather reads them back as bf16 of code x scale. 512 + 64
// (656 B) and the tiny fixtures' 32 + 8 (64 B), blocks of 64 and 1.
TEST(CudaDeepseek, Fp8LatentRecordsWrittenAndGatheredAsTheCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (const auto& [rank, rope, block] : {std::tuple{512, 64, 64}, std::tuple{32, 8, 1}}) {
    SCOPED_TRACE(::testing::Message() << rank << " + " << rope << ", block " << block);
    const int32_t dim = rank + rope, tokens = 70, blocks = (tokens + block - 1) / block + 2;
    KvPoolShape shape{1, blocks, block, 1, dim, DType::kFP8E4M3, DType::kFP8E4M3, true};
    shape.latent_rope_dim = rope;
    auto pool = CudaKvPool::create(shape);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    const DevicePagedKvLayer layer = (*pool)->layer(0);
    ASSERT_EQ(layer.key_scale, nullptr);
    // Token t: group g of the latent scaled by 2^(g - 1) (distinct group scales), the rope key in [-3, 3].
    std::vector<float> kv_a(static_cast<size_t>(tokens) * dim), ones(static_cast<size_t>(rank), 1.0f),
        inv_freq(static_cast<size_t>(rope / 2), 0.0f);
    for (int32_t t = 0; t < tokens; ++t)
      for (int32_t i = 0; i < dim; ++i)
        kv_a[static_cast<size_t>(t) * dim + i] =
            std::sin(0.37f * static_cast<float>(i + 3 * t)) *
            (i < rank ? std::ldexp(1.0f, i / 128 - 1) : 3.0f);
    std::vector<int32_t> positions(static_cast<size_t>(tokens)), table(static_cast<size_t>(blocks));
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    for (int32_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = blocks - 1 - b;  // reversed ids
    for (int32_t t = 0; t < tokens; ++t) {
      positions[static_cast<size_t>(t)] = t;
      slots[static_cast<size_t>(t)] = static_cast<int64_t>(table[static_cast<size_t>(t / block)]) * block + t % block;
    }
    auto upload = [](const auto& v) {
      auto buffer = DeviceBuffer::allocate(v.size() * sizeof(v[0]));
      EXPECT_TRUE(buffer.ok());
      EXPECT_EQ(cudaMemcpy(buffer->data(), v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice), cudaSuccess);
      return std::move(*buffer);
    };
    DeviceBuffer d_kv = upload(kv_a), d_ones = upload(ones), d_freq = upload(inv_freq), d_pos = upload(positions),
                 d_slots = upload(slots), d_table = upload(table);
    const float eps = 1e-6f;
    ASSERT_EQ(mla_latent_write(d_kv.as<float>(), nullptr, d_ones.as<float>(), eps, d_pos.as<int32_t>(),
                               d_slots.as<int64_t>(), tokens, rank, rope, d_freq.as<float>(), false, 1.0f, layer,
                               nullptr),
              cudaSuccess);
    auto gathered = DeviceBuffer::allocate(static_cast<size_t>(tokens) * dim * 2);
    ASSERT_TRUE(gathered.ok());
    ASSERT_EQ(mla_gather_latent(layer, d_table.as<int32_t>(), tokens, rank, gathered->as<bf16>(), nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const size_t record = static_cast<size_t>(kernels::mla_fp8_record_bytes(rank, rope));
    std::vector<uint8_t> records(static_cast<size_t>(blocks) * block * record);
    ASSERT_EQ(cudaMemcpy(records.data(), layer.key, records.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<uint16_t> back(static_cast<size_t>(tokens) * dim);
    ASSERT_EQ(cudaMemcpy(back.data(), gathered->data(), back.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<uint8_t> want(record);
    std::vector<float> v(static_cast<size_t>(dim)), got(static_cast<size_t>(dim)), ref(static_cast<size_t>(dim));
    for (int32_t t = 0; t < tokens; ++t) {
      const float* x = kv_a.data() + static_cast<size_t>(t) * dim;
      double sum = 0;
      for (int32_t i = 0; i < rank; ++i) sum += static_cast<double>(x[i]) * x[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(sum / rank + eps));
      for (int32_t i = 0; i < dim; ++i) v[static_cast<size_t>(i)] = i < rank ? x[i] * inv : x[i];
      kernels::mla_fp8_quantize(v.data(), rank, rope, want.data());
      const uint8_t* have = records.data() + static_cast<size_t>(slots[static_cast<size_t>(t)]) * record;
      for (int32_t g = 0; g < kernels::mla_fp8_groups(rank); ++g) {
        float a, b;
        std::memcpy(&a, have + kernels::mla_fp8_scales_at(rank) + 4 * g, 4);
        std::memcpy(&b, want.data() + kernels::mla_fp8_scales_at(rank) + 4 * g, 4);
        ASSERT_NEAR(a, b, 1e-5 * b) << "token " << t << " group " << g;
      }
      for (size_t i = static_cast<size_t>(kernels::mla_fp8_rope_at(rank)); i < record; ++i)
        ASSERT_EQ(have[i], want[i]) << "token " << t << " rope / padding byte " << i;
      kernels::mla_fp8_dequantize(have, rank, rope, got.data());
      kernels::mla_fp8_dequantize(want.data(), rank, rope, ref.data());
      for (int32_t i = 0; i < rank; ++i) {  // one e4m3 code step at most: 1/8 of the value, or a subnormal step
        float scale;
        std::memcpy(&scale, want.data() + kernels::mla_fp8_scales_at(rank) + 4 * (i / 128), 4);
        ASSERT_NEAR(got[static_cast<size_t>(i)], ref[static_cast<size_t>(i)],
                    std::abs(ref[static_cast<size_t>(i)]) / 8 + scale / 256)
            << "token " << t << " value " << i;
      }
      for (int32_t i = 0; i < dim; ++i)  // the gather: bf16 of what the record reads back as
        ASSERT_EQ(back[static_cast<size_t>(t) * dim + i], f32_to_bf16(got[static_cast<size_t>(i)]))
            << "token " << t << " value " << i;
    }
  }
}

// Swizzled bf16 latent pages (runtime/mla_latent_layout.h): the latent write stores the same bf16 rows as
// into a token-major pool, each where the page layout puts it (the host re-layout of one pool's bytes is
// the other's, byte for byte), and the prefill gather reads them back identically. 512 + 64, blocks of 64,
// 16 and 8, reversed block ids; pools the layout cannot apply to are refused, and so are kernel launches
// over a layer that claims it wrongly.
TEST(CudaDeepseek, SwizzledLatentPagesWrittenAndGatheredAsTokenMajorOnes) {
  PAGODA_SKIP_WITHOUT_GPU();
  constexpr int32_t rank = 512, rope = 64, dim = rank + rope, tokens = 150;
  auto upload = [](const auto& v) {
    auto buffer = DeviceBuffer::allocate(v.size() * sizeof(v[0]));
    EXPECT_TRUE(buffer.ok());
    EXPECT_EQ(cudaMemcpy(buffer->data(), v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice), cudaSuccess);
    return std::move(*buffer);
  };
  std::vector<float> kv_a(static_cast<size_t>(tokens) * dim), weight(static_cast<size_t>(rank)),
      inv_freq(static_cast<size_t>(rope / 2));
  for (size_t i = 0; i < kv_a.size(); ++i) kv_a[i] = std::sin(0.37f * static_cast<float>(i % 9973) + 0.01f * i);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.5f + 0.001f * static_cast<float>(i);
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / rope);
  DeviceBuffer d_kv = upload(kv_a), d_weight = upload(weight), d_freq = upload(inv_freq);
  for (int32_t block : {64, 16, 8}) {
    SCOPED_TRACE(::testing::Message() << "block " << block);
    const int32_t blocks = (tokens + block - 1) / block + 2;
    std::vector<int32_t> positions(static_cast<size_t>(tokens)), table(static_cast<size_t>(blocks));
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    for (int32_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = blocks - 1 - b;  // reversed ids
    for (int32_t t = 0; t < tokens; ++t) {
      positions[static_cast<size_t>(t)] = t + 3;
      slots[static_cast<size_t>(t)] = static_cast<int64_t>(table[static_cast<size_t>(t / block)]) * block + t % block;
    }
    DeviceBuffer d_pos = upload(positions), d_slots = upload(slots), d_table = upload(table);
    std::vector<uint8_t> bytes[2];
    std::vector<uint16_t> gathered[2];
    for (int layout = 0; layout < 2; ++layout) {
      KvPoolShape shape{1, blocks, block, 1, dim, DType::kBF16, DType::kBF16, true};
      shape.latent_rope_dim = rope;
      shape.latent_pages = layout == 0 ? runtime::MlaLatentPages::kTokenMajor : runtime::MlaLatentPages::kSwizzled128;
      auto pool = CudaKvPool::create(shape);
      ASSERT_TRUE(pool.ok()) << pool.status().to_string();
      const DevicePagedKvLayer layer = (*pool)->layer(0);
      ASSERT_EQ(layer.latent_pages, shape.latent_pages);
      ASSERT_EQ(mla_latent_write(d_kv.as<float>(), nullptr, d_weight.as<float>(), 1e-6f, d_pos.as<int32_t>(),
                                 d_slots.as<int64_t>(), tokens, rank, rope, d_freq.as<float>(), true, 1.0f, layer,
                                 nullptr),
                cudaSuccess);
      auto out = DeviceBuffer::allocate(static_cast<size_t>(tokens) * dim * 2);
      ASSERT_TRUE(out.ok());
      ASSERT_EQ(mla_gather_latent(layer, d_table.as<int32_t>(), tokens, rank, out->as<bf16>(), nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      bytes[layout].resize(static_cast<size_t>(blocks) * block * dim * 2);
      ASSERT_EQ(cudaMemcpy(bytes[layout].data(), layer.key, bytes[layout].size(), cudaMemcpyDeviceToHost), cudaSuccess);
      gathered[layout].resize(static_cast<size_t>(tokens) * dim);
      ASSERT_EQ(cudaMemcpy(gathered[layout].data(), out->data(), gathered[layout].size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      if (layout == 1) {  // a layer claiming swizzled pages it cannot have is refused, never misread
        DevicePagedKvLayer wrong = layer;
        wrong.block_size = 12;
        EXPECT_EQ(mla_latent_write(d_kv.as<float>(), nullptr, d_weight.as<float>(), 1e-6f, d_pos.as<int32_t>(),
                                   d_slots.as<int64_t>(), tokens, rank, rope, d_freq.as<float>(), true, 1.0f, wrong,
                                   nullptr),
                  cudaErrorInvalidValue);
        EXPECT_EQ(mla_gather_latent(wrong, d_table.as<int32_t>(), tokens, rank, out->as<bf16>(), nullptr),
                  cudaErrorInvalidValue);
      }
    }
    std::vector<uint8_t> relaid(bytes[1].size());
    runtime::mla_latent_relayout(reinterpret_cast<const std::byte*>(bytes[1].data()),
                                 reinterpret_cast<std::byte*>(relaid.data()), blocks, block, dim,
                                 runtime::MlaLatentPages::kSwizzled128, runtime::MlaLatentPages::kTokenMajor);
    EXPECT_TRUE(relaid == bytes[0]) << "the swizzled pool re-laid is not the token-major pool";
    EXPECT_FALSE(bytes[1] == bytes[0]) << "the swizzled pool is laid out token-major";
    EXPECT_TRUE(gathered[1] == gathered[0]) << "the gathers differ";
  }
  // Pools the layout cannot apply to.
  for (const auto& [head_dim, block, dtype] : {std::tuple{576, 12, DType::kBF16}, std::tuple{40, 16, DType::kBF16},
                                               std::tuple{576, 16, DType::kFP8E4M3}}) {
    KvPoolShape shape{1, 4, block, 1, head_dim, dtype, dtype, true};
    shape.latent_rope_dim = head_dim == 576 ? 64 : 8;
    shape.latent_pages = runtime::MlaLatentPages::kSwizzled128;
    auto pool = CudaKvPool::create(shape);
    EXPECT_FALSE(pool.ok()) << head_dim << " " << block;
    if (!pool.ok()) {
      EXPECT_NE(pool.status().message().find("swizzled128 pages need"), std::string::npos);
    }
  }
}

TEST(CudaDeepseek, RandomModelMatchesTheCpuRandomModel) {
  PAGODA_SKIP_WITHOUT_GPU();
  // A V3-shaped small config (sigmoid routing with groups, q LoRA, the real 512 / 64 latent).
  auto config = load_model_config(fixtures_dir() / "deepseek_v3_latent512_bf16");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  auto cpu = make_random_deepseek_cpu_model(*config, 7, size_t{1} << 30);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = CudaModel::create_random(*config, 7, options_for(16, DType::kBF16));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu_pool = CpuKvPool::create((*cpu)->kv_pool_shape(kNumBlocks, 16));
  auto pool = CudaKvPool::create((*gpu)->kv_pool_shape(kNumBlocks));
  ASSERT_TRUE(cpu_pool.ok() && pool.ok());
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  std::vector<float> want, got;
  ASSERT_TRUE((*cpu)->forward(single(prompt, 0, blocks_from(0, 4), true), *cpu_pool, want).ok());
  ASSERT_TRUE((*gpu)->forward(single(prompt, 0, blocks_from(0, 4), true), **pool, got).ok());
  const double error = top5_logprob_error(got, want, (*gpu)->config().vocab_size);
  std::cout << "[ figure ] random DeepSeek (latent512 shape, seed 7): max top-5 logprob |gpu - cpu| " << error << "\n";
  EXPECT_LE(error, 0.1);
}

}  // namespace
}  // namespace pagoda::cuda

namespace pagoda::cuda {
namespace {

// Step times of the DeepSeek-V2-Lite shape (random weights, bf16 latent): a
// prefill chunk of 8 x 1,024 tokens, then decode steps at context ~1K for
// batches up to PAGODA_V2_LITE_MAX_SEQS (default 1,024) eager with the simple
// MLA kernel, eager with the fast one, and in CUDA graphs. A figure printer for
// benchmarks, not a check: run it with --gtest_also_run_disabled_tests on the GPU machine.
TEST(CudaDeepseekTiming, DISABLED_V2LiteShapeStepTimes) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::filesystem::path source =
      std::filesystem::path(std::getenv("PAGODA_SOURCE_DIR") != nullptr ? std::getenv("PAGODA_SOURCE_DIR")
                                                                        : PAGODA_SOURCE_DIR);
  const char* env = std::getenv("PAGODA_V2_LITE_CONFIG");
  std::ifstream in(env != nullptr ? std::filesystem::path(env)
                                  : source / "tools/gpu_backend/deepseek_v2_lite_config.json");
  auto config = parse_model_config(nlohmann::json::parse(in), "deepseek_v2_lite_config.json");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  // Up to 1,024 sequences of 2,048 tokens (64 GiB of bf16 latent beside 32 GiB of weights).
  const char* seqs_env = std::getenv("PAGODA_V2_LITE_MAX_SEQS");
  const int32_t seqs = seqs_env != nullptr ? std::atoi(seqs_env) : 1024, prompt = 1024, block = 16;
  CudaModelOptions o;
  o.max_num_tokens = 8192;
  o.max_num_seqs = seqs;
  o.max_model_len = 2048;
  o.block_size = block;
  o.show_progress = false;
  auto model = CudaModel::create_random(*config, 1, o);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const int32_t per_seq = 2048 / block;
  auto pool = CudaKvPool::create((*model)->kv_pool_shape(seqs * per_seq));
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  // Decode steps read positions no prefill wrote: zero latents (step times do not depend on the values).
  const KvPoolShape& shape = (*pool)->shape();
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    ASSERT_EQ(cudaMemset((*pool)->layer(l).key, 0, shape.elements_per_block() * shape.num_blocks * 2), cudaSuccess);
  }
  std::vector<int32_t> tokens;
  using Clock = std::chrono::steady_clock;
  // Prefill chunks of 8 sequences x 1,024 tokens (the first one warms cuBLAS up and is not counted),
  // with the simple MLA kernel (fast_attention off), then the tensor-core prefill.
  for (const bool fast_prefill : {false, true}) {
    (*model)->set_fast_attention(fast_prefill);
    double prefill_s = 0;
    const int32_t prefill_chunks = 4;
    for (int32_t s0 = 0; s0 < 8 * prefill_chunks; s0 += 8) {
      ForwardBatch b;
      for (int32_t s = s0; s < s0 + 8; ++s) {
        SequenceSlice slice;
        slice.token_offset = static_cast<int32_t>(b.token_ids.size());
        slice.num_new_tokens = prompt;
        slice.block_table = blocks_from(s * per_seq, per_seq);
        for (int32_t i = 0; i < prompt; ++i) {
          b.token_ids.push_back((s * 131 + i * 7) % 100000);
          b.positions.push_back(i);
        }
        b.sequences.push_back(slice);
      }
      const auto t0 = Clock::now();
      ASSERT_TRUE((*model)->forward_greedy(b, **pool, tokens).ok());
      prefill_s += std::chrono::duration<double>(Clock::now() - t0).count();
      if (s0 == 0) prefill_s = 0;
    }
    std::cout << "[ figure ] V2-Lite shape: prefill chunk of 8 x 1024 tokens, "
              << (fast_prefill ? "tensor-core MLA prefill: " : "simple MLA kernel: ")
              << 1e3 * prefill_s / (prefill_chunks - 1) << " ms\n";
  }
  // Before (eager, simple MLA kernel, cuBLAS grouped MoE with a host sync per
  // layer), the fast MLA decode alone, and both with CUDA graphs (device-count
  // MoE GEMMs), then the graph path at the batch sizes MHA KV (182) and MLA KV
  // (1,024 here; 1,618 fit at 0.9 utilization) can hold.
  struct Mode {
    const char* name;
    bool graphs, fast;
    std::vector<int32_t> batches;
  };
  // The graph path here is uncapped (moe_max_graph_batch 0): the sweep 1..256 of eager against
  // graphs is what CudaModelOptions::kDefaultMoeMaxGraphBatch is chosen from.
  const std::vector<Mode> modes{{"eager+simple", false, false, {1, 64}},
                                {"eager+fast-mla", false, true, {1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 512}},
                                {"graphs+fast-mla", true, true, {1, 2, 4, 8, 16, 32, 48, 64, 128, 182, 256, 512, 1024}}};
  (*model)->set_moe_max_graph_batch(0);
  for (const Mode& mode : modes) {
    (*model)->set_use_cuda_graphs(mode.graphs);
    (*model)->set_fast_attention(mode.fast);
    for (int32_t batch : mode.batches) {
      if (batch > seqs) continue;
      std::vector<double> times;
      for (int step = 0; step < 8; ++step) {
        ForwardBatch b;
        for (int32_t s = 0; s < batch; ++s) {
          SequenceSlice slice;
          slice.token_offset = s;
          slice.num_new_tokens = 1;
          slice.num_cached_tokens = prompt + step;
          slice.block_table = blocks_from(s * per_seq, per_seq);
          b.token_ids.push_back(1 + s);
          b.positions.push_back(prompt + step);
          b.sequences.push_back(slice);
        }
        const auto t0 = Clock::now();
        ASSERT_TRUE((*model)->forward_greedy(b, **pool, tokens).ok());
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      std::cout << "[ figure ] V2-Lite shape, " << mode.name << ": decode step at batch " << batch << ", context ~"
                << prompt << ": " << 1e3 * median << " ms (median of 8), " << batch / median << " tok/s\n";
    }
  }
}

}  // namespace
}  // namespace pagoda::cuda

namespace pagoda::cuda {
namespace {

// The paged MLA decode kernel (attention/mla_decode.h) in the model: a decode
// batch of sequences with mixed context lengths, on the fast kernel eagerly and
// inside a CUDA graph (a fixed plan with one padding row), against the same
// model with every row on the simple kernel (fast_attention off), and a mixed
// step (two decodes on the fast kernel, a prompt chunk on the simple one).
// Random weights of the latent512 fixture's shape (the kernel's 512 + 64
// latent) with 16 heads, as DeepSeek-V2-Lite. The two kernels round
// differently (the fast one rounds P to bf16), so logits are compared with the
// top-5 logprob measure; graph replays must equal the captured step bit for bit.
class DeepseekFastDecodeTest : public ::testing::TestWithParam<std::tuple<int32_t, DType>> {};

ForwardBatch decode_batch(const std::vector<int32_t>& lengths, int32_t per_seq) {
  ForwardBatch b;
  for (size_t s = 0; s < lengths.size(); ++s) {
    SequenceSlice slice;
    slice.token_offset = static_cast<int32_t>(s);
    slice.num_new_tokens = 1;
    slice.num_cached_tokens = lengths[s];
    slice.block_table = blocks_from(static_cast<int32_t>(s) * per_seq, per_seq);
    b.token_ids.push_back(static_cast<int32_t>(17 + 5 * s));
    b.positions.push_back(lengths[s]);
    b.sequences.push_back(std::move(slice));
  }
  return b;
}

TEST_P(DeepseekFastDecodeTest, FastDecodeEqualsSimpleKernel) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto& [block_size, latent] = GetParam();
  auto config = load_model_config(fixtures_dir() / "deepseek_v3_latent512_bf16");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  config->num_q_heads = 16;
  CudaModelOptions o = options_for(block_size, latent);
  o.max_model_len = 512;
  o.max_num_tokens = 512;
  auto model = CudaModel::create_random(*config, 11, o);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  CudaModel& m = **model;
  m.set_moe_max_graph_batch(0);  // graphs at bucket 4 whatever the default cap
  const int32_t per_seq = 512 / block_size;
  auto pool_or = CudaKvPool::create(m.kv_pool_shape(4 * per_seq));
  ASSERT_TRUE(pool_or.ok()) << pool_or.status().to_string();
  CudaKvPool& pool = **pool_or;
  const int32_t vocab = m.config().vocab_size;
  // Prefill three sequences of 5, 70 and 300 tokens (eagerly, simple kernel for prompt rows).
  const std::vector<int32_t> lengths{5, 70, 300};
  std::vector<float> logits;
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<int32_t> prompt(static_cast<size_t>(lengths[s]));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 31 + 7 * s + 3) % 256);
    ASSERT_TRUE(m.forward(single(prompt, 0, blocks_from(static_cast<int32_t>(s) * per_seq, per_seq), false), pool,
                          logits)
                    .ok());
  }
  const ForwardBatch step = decode_batch(lengths, per_seq);
  // Every row on the simple kernel, eagerly.
  m.set_use_cuda_graphs(false);
  m.set_fast_attention(false);
  std::vector<float> simple, fast, graph_first, graph_replay;
  int64_t fast_steps = m.fast_attention_steps();
  ASSERT_TRUE(m.forward(step, pool, simple).ok());
  EXPECT_EQ(m.fast_attention_steps(), fast_steps);
  // The fast kernel, eagerly.
  m.set_fast_attention(true);
  ASSERT_TRUE(m.forward(step, pool, fast).ok());
  EXPECT_EQ(m.fast_attention_steps(), fast_steps + 1) << "the fast MLA decode did not run";
  const double eager_error = top5_logprob_error(fast, simple, vocab);
  // In a graph (bucket 4: one padding row), captured, then replayed.
  m.set_use_cuda_graphs(true);
  const int64_t replays = m.graph_replays();
  ASSERT_TRUE(m.forward(step, pool, graph_first).ok());
  ASSERT_TRUE(m.forward(step, pool, graph_replay).ok());
  EXPECT_EQ(m.graph_replays(), replays + 1);
  EXPECT_EQ(graph_first, graph_replay);
  const double graph_error = top5_logprob_error(graph_first, simple, vocab);
  // A mixed step: two decodes (fast) and a 40-token prompt chunk of sequence 3 (simple).
  ForwardBatch mixed = decode_batch({5, 70}, per_seq);
  SequenceSlice chunk;
  chunk.token_offset = 2;
  chunk.num_new_tokens = 40;
  chunk.block_table = blocks_from(3 * per_seq, per_seq);
  chunk.logits_for_all_new_tokens = true;
  for (int32_t i = 0; i < 40; ++i) {
    mixed.token_ids.push_back((i * 13 + 1) % 256);
    mixed.positions.push_back(i);
  }
  mixed.sequences.push_back(chunk);
  std::vector<float> mixed_fast, mixed_simple;
  ASSERT_TRUE(m.forward(mixed, pool, mixed_fast).ok());
  m.set_fast_attention(false);
  ASSERT_TRUE(m.forward(mixed, pool, mixed_simple).ok());
  const double mixed_error = top5_logprob_error(mixed_fast, mixed_simple, vocab);
  std::cout << "[ figure ] fast MLA decode vs simple kernel, block " << block_size << " "
            << (latent == DType::kBF16 ? "bf16" : "fp8") << ": max top-5 logprob diff eager " << eager_error
            << ", graph " << graph_error << ", mixed step " << mixed_error << "\n";
  EXPECT_LE(eager_error, 0.05);
  EXPECT_LE(graph_error, 0.05);
  EXPECT_LE(mixed_error, 0.05);
  // The MoE in graph steps (device row counts) against the eager cuBLAS path, same simple attention.
  m.set_use_cuda_graphs(true);
  std::vector<float> graph_simple;
  ASSERT_TRUE(m.forward(step, pool, graph_simple).ok());
  const double moe_error = top5_logprob_error(graph_simple, simple, vocab);
  std::cout << "[ figure ] graph step (device-count MoE GEMMs) vs eager (cuBLAS grouped), simple attention: "
            << moe_error << "\n";
  EXPECT_LE(moe_error, 0.05);
}

// More than 16 heads (20: the 64-head-tile kernel with a partial tile): a
// decode step takes the fast kernel with the fp8 pool's 656-byte records as
// with bf16, and matches the simple kernel (fast_attention off).
TEST(DeepseekFastDecode, MoreThan16HeadsTakeTheWideKernelInBf16AndFp8Records) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (DType latent : {DType::kFP8E4M3, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(latent));
    auto config = load_model_config(fixtures_dir() / "deepseek_v3_latent512_bf16");
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    config->num_q_heads = 20;
    CudaModelOptions o = options_for(16, latent);
    o.max_model_len = 128;
    o.max_num_tokens = 256;
    auto model = CudaModel::create_random(*config, 5, o);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    CudaModel& m = **model;
    m.set_use_cuda_graphs(false);
    auto pool = CudaKvPool::create(m.kv_pool_shape(2 * 8));
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    const std::vector<int32_t> lengths{9, 40};
    std::vector<float> logits, fast, simple;
    for (size_t s = 0; s < lengths.size(); ++s) {
      std::vector<int32_t> prompt(static_cast<size_t>(lengths[s]));
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 29 + 5 * s + 1) % 256);
      ASSERT_TRUE(m.forward(single(prompt, 0, blocks_from(static_cast<int32_t>(s) * 8, 8), false), **pool, logits).ok());
    }
    const ForwardBatch step = decode_batch(lengths, 8);
    m.set_fast_attention(true);
    const int64_t before = m.fast_attention_steps();
    ASSERT_TRUE(m.forward(step, **pool, fast).ok());
    const bool took_fast = m.fast_attention_steps() > before;
    m.set_fast_attention(false);
    ASSERT_TRUE(m.forward(step, **pool, simple).ok());
    EXPECT_TRUE(took_fast);
    const double error = top5_logprob_error(fast, simple, m.config().vocab_size);
    std::cout << "[ figure ] 20 heads, " << dtype_name(latent) << " latent: fast vs simple decode " << error << "\n";
    EXPECT_LE(error, 0.05);
  }
}

// The same random latent512 model on a swizzled-page pool (CudaModelOptions::mla_latent_pages) and on a
// token-major one: prompts through the tensor-core prefill and the simple kernel (every row's logits), decode
// steps on the fast kernel eagerly and in a graph (capture and replay), on the simple kernel, and after a
// copy-on-write of a sequence's blocks. Every kernel reads the same values in the same order, so the logits
// are equal bit for bit: at blocks of 8 and 16 both pools take the cp.async kernel; at blocks of 64 the
// token-major pool takes the tensor-map ping-pong kernel and the swizzled one the bulk-copy kernel, whose
// math is the same.
TEST(DeepseekSwizzledPages, TheModelGivesTheTokenMajorPoolsLogits) {
  PAGODA_SKIP_WITHOUT_GPU();
  // The comparison needs each model's own layout and the automatic kernel choice.
  for (const char* name : {"PAGODA_MLA_LATENT_PAGES", "PAGODA_MLA_DECODE_KERNEL"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0')
      GTEST_SKIP() << name << " is set: the test compares the layouts under the automatic kernel choice";
  auto config = load_model_config(fixtures_dir() / "deepseek_v3_latent512_bf16");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  config->num_q_heads = 16;
  for (int32_t block_size : {16, 8, 64}) {
    SCOPED_TRACE(::testing::Message() << "block " << block_size);
    std::vector<float> results[2];
    for (int layout = 0; layout < 2; ++layout) {
      CudaModelOptions o = options_for(block_size, DType::kBF16);
      o.max_model_len = 512;
      o.max_num_tokens = 512;
      o.mla_latent_pages = layout == 0 ? runtime::MlaLatentPages::kTokenMajor : runtime::MlaLatentPages::kSwizzled128;
      auto model = CudaModel::create_random(*config, 23, o);
      ASSERT_TRUE(model.ok()) << model.status().to_string();
      CudaModel& m = **model;
      m.set_moe_max_graph_batch(0);
      const int32_t per_seq = 512 / block_size;
      const KvPoolShape shape = m.kv_pool_shape(5 * per_seq);
      ASSERT_EQ(shape.latent_pages, *o.mla_latent_pages);
      auto pool_or = CudaKvPool::create(shape);
      ASSERT_TRUE(pool_or.ok()) << pool_or.status().to_string();
      CudaKvPool& pool = **pool_or;
      std::vector<float>& all = results[layout];
      std::vector<float> logits;
      auto run = [&](const ForwardBatch& b) {
        ASSERT_TRUE(m.forward(b, pool, logits).ok());
        all.insert(all.end(), logits.begin(), logits.end());
      };
      const std::vector<int32_t> lengths{5, 70, 300};
      m.set_use_cuda_graphs(false);
      for (size_t s = 0; s < lengths.size(); ++s) {  // sequence 0 on the simple kernel, the others the prefill
        m.set_fast_attention(s > 0);
        std::vector<int32_t> prompt(static_cast<size_t>(lengths[s]));
        for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 31 + 7 * s + 3) % 256);
        run(single(prompt, 0, blocks_from(static_cast<int32_t>(s) * per_seq, per_seq), true));
      }
      const ForwardBatch step = decode_batch(lengths, per_seq);
      m.set_fast_attention(true);
      run(step);
      m.set_fast_attention(false);
      run(step);
      m.set_fast_attention(true);
      m.set_use_cuda_graphs(true);
      const int64_t replays = m.graph_replays();
      run(step);
      run(step);
      EXPECT_EQ(m.graph_replays(), replays + 1);
      // Copy-on-write: sequence 1's blocks copied to sequence 3's, then a step there.
      std::vector<runtime::BlockCopy> copies;
      for (int32_t i = 0; i < (71 + block_size - 1) / block_size; ++i) copies.push_back({per_seq + i, 3 * per_seq + i});
      ASSERT_TRUE(pool.copy_blocks(copies, m.stream()).ok());
      ASSERT_EQ(cudaStreamSynchronize(m.stream()), cudaSuccess);
      m.set_use_cuda_graphs(false);
      ForwardBatch copied = decode_batch({71}, per_seq);
      copied.sequences[0].block_table = blocks_from(3 * per_seq, per_seq);
      run(copied);
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    size_t differing = 0;
    for (size_t i = 0; i < results[0].size(); ++i) differing += results[0][i] != results[1][i];
    EXPECT_EQ(differing, 0u) << "logits differ between the token-major and the swizzled pool";
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, DeepseekFastDecodeTest,
                         ::testing::Combine(::testing::Values(16, 64, 1),
                                            ::testing::Values(DType::kBF16, DType::kFP8E4M3)),
                         [](const ::testing::TestParamInfo<std::tuple<int32_t, DType>>& info) {
                           return "block" + std::to_string(std::get<0>(info.param)) + "_" +
                                  (std::get<1>(info.param) == DType::kBF16 ? "bf16" : "fp8");
                         });

}  // namespace
}  // namespace pagoda::cuda

namespace pagoda::cuda {
namespace {

using testing::append_sequence;

// The tensor-core MLA prefill (cuda_deepseek_mla_prefill.h) in the model
// against the simple kernel (fast_attention off), on DeepSeek's head dims
// (qk 128 nope + 64 rope, v 128, latent 512 + 64, 16 heads as V2-Lite):
//  1. fresh prompts of 1, 33, 1,500, 1 and 200 tokens in one step (the first
//     one-token prompt stays on the absorbed kernels, the rest on the prefill;
//     logits at every row);
//  2. a mixed step: two decodes (fast kernel), a chunk continuing the
//     200-token prompt (100 rows after 200 cached), and a prefix hit: a new
//     sequence on the 1,500-token prompt's first 960 cached positions (its
//     full blocks at every block size here) with 300 new rows in fresh blocks;
//  3. step 2 again with a small score budget, so that every segment runs in
//     many query chunks.
// Measure: largest top-5 logprob difference over every logit row (bound 0.05,
// as the fast decode's); the prefill rounds K, V and P to bf16.
class DeepseekPrefillTest : public ::testing::TestWithParam<std::tuple<int32_t, DType>> {};

std::vector<int32_t> prompt_tokens(int32_t n, int32_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + salt * 11 + 5) % 256;
  return t;
}

TEST_P(DeepseekPrefillTest, TensorCorePrefillEqualsSimpleKernel) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto& [block_size, latent] = GetParam();
  auto config = load_model_config(fixtures_dir() / "deepseek_v3_latent512_bf16");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  config->num_q_heads = 16;
  config->mla->qk_nope_head_dim = 128;
  config->mla->v_head_dim = 128;
  config->mla->softmax_scale = 1.0f / std::sqrt(192.0f);
  CudaModelOptions o = options_for(block_size, latent);
  o.max_model_len = 2048;
  o.max_num_tokens = 2048;
  auto model = CudaModel::create_random(*config, 13, o);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  CudaModel& m = **model;
  m.set_use_cuda_graphs(false);
  const int32_t per_seq = 2048 / block_size;
  auto pool_or = CudaKvPool::create(m.kv_pool_shape(7 * per_seq));
  ASSERT_TRUE(pool_or.ok()) << pool_or.status().to_string();
  CudaKvPool& pool = **pool_or;
  const int32_t vocab = m.config().vocab_size;
  auto table = [&](int32_t s) { return blocks_from(s * per_seq, per_seq); };
  // Runs `b` with the prefill and with the simple kernel; returns the logit difference.
  auto compare = [&](const ForwardBatch& b, const char* what) {
    std::vector<float> prefill, simple;
    m.set_fast_attention(true);
    const int64_t steps = m.mla_prefill_steps();
    EXPECT_TRUE(m.forward(b, pool, prefill).ok());
    EXPECT_EQ(m.mla_prefill_steps(), steps + 1) << what << ": the prefill did not run";
    m.set_fast_attention(false);
    EXPECT_TRUE(m.forward(b, pool, simple).ok());
    EXPECT_EQ(m.mla_prefill_steps(), steps + 1);
    EXPECT_EQ(prefill.size(), simple.size());
    const double error = top5_logprob_error(prefill, simple, vocab);
    std::cout << "[ figure ] MLA prefill vs simple kernel, block " << block_size << " "
              << (latent == DType::kBF16 ? "bf16" : "fp8") << ", " << what << ": max top-5 logprob diff " << error
              << " over " << prefill.size() / vocab << " rows\n";
    EXPECT_LE(error, 0.05) << what;
  };
  ForwardBatch fresh;
  const std::vector<int32_t> lengths{1, 33, 1500, 1, 200};
  for (size_t s = 0; s < lengths.size(); ++s)
    append_sequence(fresh, prompt_tokens(lengths[s], static_cast<int32_t>(s)), 0, table(static_cast<int32_t>(s)),
                    true);
  compare(fresh, "fresh prompts 1/33/1500/1/200");
  ForwardBatch mixed;
  append_sequence(mixed, {7}, 1, table(0), false);
  append_sequence(mixed, {9}, 33, table(1), false);
  append_sequence(mixed, prompt_tokens(100, 4), 200, table(4), true);
  std::vector<int32_t> hit = blocks_from(2 * per_seq, 960 / block_size);
  for (int32_t b : blocks_from(5 * per_seq, per_seq)) hit.push_back(b);
  hit.resize(static_cast<size_t>(per_seq));
  append_sequence(mixed, prompt_tokens(300, 5), 960, hit, true);
  compare(mixed, "decodes + chunk after 200 + prefix hit 960 + 300");
  CudaMlaPrefill::Tuning small;
  small.score_budget_bytes = size_t{1} << 20;  // ~ a few query rows per chunk
  m.set_mla_prefill_tuning(small);
  compare(mixed, "the same in small query chunks");
  m.set_mla_prefill_tuning(CudaMlaPrefill::Tuning{});
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, DeepseekPrefillTest,
                         ::testing::Combine(::testing::Values(16, 64, 1),
                                            ::testing::Values(DType::kBF16, DType::kFP8E4M3)),
                         [](const ::testing::TestParamInfo<std::tuple<int32_t, DType>>& info) {
                           return "block" + std::to_string(std::get<0>(info.param)) + "_" +
                                  (std::get<1>(info.param) == DType::kBF16 ? "bf16" : "fp8");
                         });

}  // namespace
}  // namespace pagoda::cuda
