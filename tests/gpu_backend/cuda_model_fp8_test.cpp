// fp8 weights in the CUDA model against the CPU reference (CpuModel): the FP8
// checkpoint fixtures (tests/fixtures/fp8: compressed-tensors per channel +
// dynamic tokens, per tensor + static inputs with one projection left bf16,
// ModelOpt, block fp8) and --quantization fp8 on the bundled model. The CPU
// computes what an fp8 GEMM computes in f32 (dequantized weights, activations
// rounded through fp8 as the scheme says); the GPU runs e4m3 tensor-core GEMMs
// on bf16 activations, so an activation near an fp8 rounding boundary may round
// the other way there, and every other op runs on bf16 activations (the CPU's
// are f32). Bound kAbsTol + kRelTol * max|logit|, measured on the H200
// (docs/BENCHMARKS.md): 2.26-2.63x of 0.05 + 0.03 max|logit| for every case,
// the block_fp8 fixture (which runs dequantized bf16 on the GPU) included at
// 2.54x, so the distance is the GPU's bf16 activations, not its fp8 GEMMs; the
// bound is 3x that. A scale applied the wrong way misses by orders of
// magnitude. Prefill (all rows) and decode steps replayed from CUDA graphs. The
// single-row decode steps run the weight-only GEMV (gemv.h: bf16 activations, no
// fp8 rounding of them) for the dynamic schemes and block_fp8_128, which moves
// those ratios (docs/BENCHMARKS.md, "Weight-streaming GEMV"); static input scales
// keep the quantize + fp8 GEMM path.

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cuda/cuda_model.h"

namespace pagoda::cuda {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 32;
constexpr double kAbsTol = 0.15;
constexpr double kRelTol = 0.09;

std::filesystem::path source_dir() {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR);
}

ForwardBatch single(const std::vector<int32_t>& tokens, int32_t cached, bool all_logits) {
  ForwardBatch b;
  b.token_ids = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(cached + static_cast<int32_t>(i));
  SequenceSlice s;
  s.num_new_tokens = static_cast<int32_t>(tokens.size());
  s.num_cached_tokens = cached;
  s.block_table.resize(8);
  std::iota(s.block_table.begin(), s.block_table.end(), 0);
  s.logits_for_all_new_tokens = all_logits;
  b.sequences.push_back(std::move(s));
  return b;
}

// max |a - b| / (kAbsTol + kRelTol * max |b|)
double error_ratio(const std::vector<float>& got, const std::vector<float>& want, double* abs_err) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    err = std::isnan(d) ? 1e30 : std::max(err, d);
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  *abs_err = err;
  return err / (kAbsTol + kRelTol * scale);
}

struct Fp8Case {
  std::string name;  // tests/fixtures/fp8/<name>, or "pagoda-tiny --quantization fp8"
  std::filesystem::path dir;
  bool quantize;               // --quantization fp8 on both sides
  int32_t fp8_projections;     // projections the GPU runs fp8 (-1: 4 per layer)
};

class CudaFp8ModelTest : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(CudaFp8ModelTest, LogitsMatchTheCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  const Fp8Case& c = GetParam();
  auto cpu = CpuModel::load(c.dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  if (c.quantize) {
    ASSERT_TRUE((*cpu)->quantize_weights(DType::kFP8E4M3).ok());
  }
  auto cpu_pool = CpuKvPool::create((*cpu)->kv_pool_shape(kNumBlocks, kBlockSize));
  ASSERT_TRUE(cpu_pool.ok());
  CudaModelOptions options;
  options.max_num_tokens = 64;
  options.max_num_seqs = 4;
  options.max_model_len = 128;
  options.block_size = kBlockSize;
  options.show_progress = false;
  options.fp8_weights = c.quantize;
  // The CPU reference keeps fp8 models' lm_head as loaded (bf16), so this test measures the fp8 projections
  // against it with the bf16 head; the default e4m3 head is measured against the bf16 head by
  // CudaModel.Fp8LmHeadMatchesTheBf16LmHead.
  options.fp8_lm_head = false;
  auto gpu = CudaModel::load(c.dir, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  const int32_t layers = (*gpu)->config().num_layers;
  EXPECT_EQ((*gpu)->fp8_projections(), c.fp8_projections < 0 ? 4 * layers : c.fp8_projections);
  auto pool = CudaKvPool::create((*gpu)->kv_pool_shape(kNumBlocks));
  ASSERT_TRUE(pool.ok());

  const int32_t vocab = (*gpu)->config().vocab_size;
  std::vector<int32_t> prompt(21);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
  std::vector<float> want, got;
  ASSERT_TRUE((*cpu)->forward(single(prompt, 0, true), *cpu_pool, want).ok());
  const Status s = (*gpu)->forward(single(prompt, 0, true), **pool, got);
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(got.size(), want.size());
  double prefill_abs = 0;
  const double prefill = error_ratio(got, want, &prefill_abs);
  // Teacher-forced decode on the CPU's greedy tokens (graph replays on the GPU).
  double decode = 0, decode_abs = 0;
  int32_t length = static_cast<int32_t>(prompt.size());
  std::vector<float> last(want.end() - vocab, want.end());
  for (int step = 0; step < 8; ++step) {
    const int32_t token = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    ASSERT_TRUE((*cpu)->forward(single({token}, length, false), *cpu_pool, want).ok());
    const Status d = (*gpu)->forward(single({token}, length, false), **pool, got);
    ASSERT_TRUE(d.ok()) << d.to_string();
    double a = 0;
    decode = std::max(decode, error_ratio(got, want, &a));
    decode_abs = std::max(decode_abs, a);
    last = want;
    ++length;
  }
  std::cout << "[ figure ] " << c.name << ": fp8 projections " << (*gpu)->fp8_projections() << "/" << 4 * layers
            << " (" << (*gpu)->fp8_scale_mode_name() << "), prefill max |gpu - cpu| " << prefill_abs
            << " (error/bound " << prefill << "), decode " << decode_abs << " (" << decode << "), graph replays "
            << (*gpu)->graph_replays() << "\n";
  EXPECT_LE(prefill, 1.0);
  EXPECT_LE(decode, 1.0);
  EXPECT_GT((*gpu)->graph_replays(), 0);
}

std::vector<Fp8Case> cases() {
  const auto fp8 = source_dir() / "tests/fixtures/fp8";
  return {
      {"ct_channel_dynamic", fp8 / "ct_channel_dynamic", false, -1},
      // Layer 1's down_proj is left bf16 by the checkpoint's ignore list.
      {"ct_tensor_static", fp8 / "ct_tensor_static", false, 7},
      {"modelopt_fp8", fp8 / "modelopt_fp8", false, -1},
      // 32x32 blocks (the fixture's model is 64 wide): not cuBLASLt's 128x128, so dequantized to bf16.
      {"block_fp8", fp8 / "block_fp8", false, 0},
      // 128x128 blocks on a model of whole blocks (a tiny Qwen3): block fp8 GEMMs in prefill, the fp8 GEMV
      // with block scales in the decode steps.
      {"block_fp8_128", fp8 / "block_fp8_128", false, -1},
      {"pagoda_tiny_quantization_fp8", source_dir() / "models/pagoda-tiny", true, -1},
  };
}

INSTANTIATE_TEST_SUITE_P(Fp8, CudaFp8ModelTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) { return info.param.name; });

}  // namespace
}  // namespace pagoda::cuda
