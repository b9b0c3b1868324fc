// The whole model on the GPU with a quantized KV cache: free-running greedy
// decoding with int8 (and fp8) KV gives the same tokens as bf16 KV for at least
// the first 8 tokens on the committed fixtures and the bundled model; a
// divergence is only accepted at a near tie of the bf16 run (top-1 margin under
// kMarginTol). int4 is reported, not asserted. Prints the divergence step and
// the logit gap per format as figures. And backend/cuda/attention's quantized decode in
// the model against the builtin kernel on the same codes. And a checkpoint's
// per-tensor fp8 KV scales (self_attn.k_scale / v_scale, added to a copy of a
// committed fixture): bound and validated as on the CPU, and fp8 KV logits on
// the GPU match CpuModel's with the same scales, including scales that clip.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/model/model_config.h"
#include "pagoda/model/model_weights.h"

namespace pagoda::cuda {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 32;
constexpr int32_t kSteps = 16;
constexpr int32_t kMustAgree = 8;
constexpr float kMarginTol = 0.05f;

std::filesystem::path source_dir() {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR);
}

struct Run {
  std::vector<int32_t> tokens;
  std::vector<float> margin;    // top-1 minus top-2 logit per step
  std::vector<float> top_logit; // the chosen token's logit per step
  std::vector<std::vector<float>> logits;
};

// Free-running greedy decoding of kSteps tokens after `prompt`, on a fresh pool.
// One sequence's forward step: `tokens` at positions cached.. over `table`
// (the pool's blocks in reverse order, so not the identity).
ForwardBatch one_sequence_step(const std::vector<int32_t>& tokens, int32_t cached, bool logits_for_all) {
  ForwardBatch b;
  b.token_ids = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(cached + static_cast<int32_t>(i));
  SequenceSlice s;
  s.num_new_tokens = static_cast<int32_t>(tokens.size());
  s.num_cached_tokens = cached;
  s.block_table.resize(kNumBlocks);
  std::iota(s.block_table.begin(), s.block_table.end(), 0);
  std::reverse(s.block_table.begin(), s.block_table.end());
  s.logits_for_all_new_tokens = logits_for_all;
  b.sequences.push_back(s);
  return b;
}

// The small model options of these tests with `kv_dtype` for K and V.
CudaModelOptions test_options(DType kv_dtype) {
  CudaModelOptions o;
  o.max_num_tokens = 256;
  o.max_num_seqs = 4;
  o.max_model_len = 512;
  o.block_size = kBlockSize;
  o.show_progress = false;
  o.kv_key_dtype = o.kv_value_dtype = kv_dtype;
  return o;
}

StatusOr<Run> greedy(const std::filesystem::path& dir, const std::vector<int32_t>& prompt, DType kv_dtype) {
  const CudaModelOptions o = test_options(kv_dtype);
  PAGODA_ASSIGN_OR_RETURN(auto model, CudaModel::load(dir, o));
  PAGODA_ASSIGN_OR_RETURN(auto pool, CudaKvPool::create(model->kv_pool_shape(kNumBlocks)));
  Run run;
  std::vector<int32_t> step_tokens = prompt;
  int32_t cached = 0;
  for (int32_t step = 0; step < kSteps; ++step) {
    const ForwardBatch b = one_sequence_step(step_tokens, cached, false);
    std::vector<float> logits;
    PAGODA_RETURN_IF_ERROR(model->forward(b, *pool, logits));
    std::vector<float> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(next);
    run.margin.push_back(sorted[0] - sorted[1]);
    run.top_logit.push_back(sorted[0]);
    run.logits.push_back(std::move(logits));
    cached += static_cast<int32_t>(step_tokens.size());
    step_tokens = {next};
  }
  return run;
}

std::vector<int32_t> fixture_prompt(const std::filesystem::path& dir) {
  std::ifstream in(dir / "expected.json");
  return nlohmann::json::parse(in).at("prompt_ids").get<std::vector<int32_t>>();
}

std::vector<int32_t> random_prompt(int32_t vocab, int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(3, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = pick(rng);
  return ids;
}

class QuantizedKvModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedKvModelTest, GreedyTokensMatchBf16Kv) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::string name = GetParam();
  const bool bundled = name == "pagoda-tiny";
  const std::filesystem::path dir =
      bundled ? source_dir() / "models" / name : source_dir() / "tests/fixtures/models" / name;
  const std::vector<int32_t> prompt = bundled ? random_prompt(4096, 48, 5) : fixture_prompt(dir);
  auto reference = greedy(dir, prompt, DType::kBF16);
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  for (DType dtype : {DType::kInt8, DType::kFP8E4M3, DType::kInt4}) {
    auto run = greedy(dir, prompt, dtype);
    ASSERT_TRUE(run.ok()) << dtype_name(dtype) << ": " << run.status().to_string();
    int32_t agreed = 0;
    while (agreed < kSteps && run->tokens[agreed] == reference->tokens[agreed]) ++agreed;
    double first_logit_diff = 0;  // largest |logit difference| at step 0 (same inputs in both runs)
    for (size_t i = 0; i < run->logits[0].size(); ++i)
      first_logit_diff = std::max<double>(first_logit_diff, std::abs(run->logits[0][i] - reference->logits[0][i]));
    std::cout << "[ figure ] " << name << " KV " << dtype_name(dtype) << ": " << agreed << "/" << kSteps
              << " greedy tokens equal to bf16 KV; step-0 max |logit diff| " << first_logit_diff;
    if (agreed < kSteps) {
      const std::vector<float>& ref_logits = reference->logits[agreed];
      const float gap = ref_logits[reference->tokens[agreed]] - ref_logits[run->tokens[agreed]];
      std::cout << "; diverges at step " << agreed << " (bf16 logit gap between the two tokens " << gap
                << ", bf16 top-1 margin " << reference->margin[agreed] << ")";
    }
    std::cout << "\n";
    if (dtype != DType::kInt4 && agreed < kMustAgree) {
      EXPECT_LE(reference->margin[agreed], kMarginTol)
          << name << " KV " << dtype_name(dtype) << " diverges at step " << agreed << " where bf16 is no near tie";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, QuantizedKvModelTest,
                         ::testing::Values("llama_f32", "llama_mqa_f16", "mistral_bf16", "qwen3_sharded_f32",
                                           "pagoda-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// backend/cuda/attention's quantized decode inside the model (head_dim 128, eager and
// CUDA-graph steps) against the builtin kernel on the same quantized KV: both
// read the same codes, so only the kernels' arithmetic differs (f16 q and p on
// tensor cores vs bf16 tiles).
TEST(QuantizedKvModel, FastDecodeMatchesBuiltinAttentionOnTheSameCodes) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  const nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 512}, {"hidden_size", 512},
      {"intermediate_size", 1024}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
      {"num_key_value_heads", 1}, {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 500000.0}, {"torch_dtype", "bfloat16"}};
  auto config = parse_model_config(j, "test config");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  ASSERT_EQ(config->head_dim, 128);
  for (auto [key, value] : {std::pair{DType::kInt8, DType::kInt8}, {DType::kFP8E4M3, DType::kFP8E4M3},
                            {DType::kInt4, DType::kInt4}, {DType::kInt8, DType::kInt4}}) {
    CudaModelOptions o;
    o.max_num_tokens = 256;
    o.max_num_seqs = 4;
    o.max_model_len = 512;
    o.block_size = kBlockSize;
    o.show_progress = false;
    o.kv_key_dtype = key;
    o.kv_value_dtype = value;
    auto fast = CudaModel::create_random(*config, 11, o);
    o.fast_attention = false;
    auto builtin = CudaModel::create_random(*config, 11, o);
    ASSERT_TRUE(fast.ok() && builtin.ok());
    auto pool_a = CudaKvPool::create((*fast)->kv_pool_shape(kNumBlocks));
    auto pool_b = CudaKvPool::create((*builtin)->kv_pool_shape(kNumBlocks));
    ASSERT_TRUE(pool_a.ok() && pool_b.ok());
    const std::string what = std::string("K ") + std::string(dtype_name(key)) + " V " + std::string(dtype_name(value));
    // Three sequences: prefill (builtin in both: quantized prefill is not
    // planned), then decode steps, which replay graphs after the first.
    std::vector<int32_t> lengths = {45, 3, 130};
    std::vector<int32_t> next = {7, 8, 9};
    std::vector<std::vector<int32_t>> tables = {{0, 1, 2, 3, 4, 5, 6, 7}, {17, 9, 10, 11, 12, 13, 14, 15},
                                                {16, 31, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27}};
    {
      ForwardBatch b;
      for (size_t s = 0; s < lengths.size(); ++s) {
        SequenceSlice slice;
        slice.token_offset = b.num_tokens();
        slice.num_new_tokens = lengths[s];
        slice.block_table = tables[s];
        for (int32_t p = 0; p < lengths[s]; ++p) {
          b.token_ids.push_back((p * 37 + static_cast<int32_t>(s) * 11) % 512);
          b.positions.push_back(p);
        }
        b.sequences.push_back(slice);
      }
      std::vector<float> la, lb;
      ASSERT_TRUE((*fast)->forward(b, **pool_a, la).ok());
      ASSERT_TRUE((*builtin)->forward(b, **pool_b, lb).ok());
    }
    double worst = 0, scale = 0;
    for (int step = 0; step < 6; ++step) {
      ForwardBatch b;
      for (size_t s = 0; s < lengths.size(); ++s) {
        SequenceSlice slice;
        slice.token_offset = static_cast<int32_t>(s);
        slice.num_new_tokens = 1;
        slice.num_cached_tokens = lengths[s];
        slice.block_table = tables[s];
        b.token_ids.push_back(next[s]);
        b.positions.push_back(lengths[s]);
        b.sequences.push_back(slice);
      }
      std::vector<float> la, lb;
      const Status sa = (*fast)->forward(b, **pool_a, la);
      const Status sb = (*builtin)->forward(b, **pool_b, lb);
      ASSERT_TRUE(sa.ok()) << what << ": " << sa.to_string();
      ASSERT_TRUE(sb.ok()) << what << ": " << sb.to_string();
      for (size_t i = 0; i < la.size(); ++i) {
        worst = std::max<double>(worst, std::abs(la[i] - lb[i]));
        scale = std::max<double>(scale, std::abs(lb[i]));
      }
      for (size_t s = 0; s < lengths.size(); ++s) {
        ++lengths[s];
        next[s] = static_cast<int32_t>(std::max_element(lb.begin() + s * 512, lb.begin() + (s + 1) * 512) -
                                       (lb.begin() + s * 512));
      }
    }
    std::cout << "[ figure ] quantized fast vs builtin decode in the model, " << what << ": max |logit diff| " << worst
              << " (max |logit| " << scale << "), fast steps " << (*fast)->fast_attention_steps() << "\n";
    EXPECT_GT((*fast)->fast_attention_steps(), 0) << what << ": the fast kernels never ran";
    EXPECT_LE(worst, 1e-3 + 0.03 * scale) << what;
  }
}

// --- A checkpoint's per-tensor fp8 KV scales ---------------------------------

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A copy of the committed fixture `name` in a fresh temp dir whose
// model.safetensors also holds f32 model.layers.N.self_attn.k_scale / v_scale
// in every layer (shape `shape`, every element the given value), as an
// llm-compressor fp8 checkpoint carries them. The original tensors keep their
// bytes and offsets; the scales are appended to the data section. Single-file
// fixtures only (not qwen3_sharded_f32).
std::filesystem::path fixture_with_kv_scales(const std::string& name, float k_scale, float v_scale,
                                             const std::vector<int64_t>& shape = {}) {
  const std::filesystem::path from = source_dir() / "tests/fixtures/models" / name;
  static int copies = 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("pagoda_kv_scales_" + std::to_string(::getpid()) + "_" + std::to_string(copies++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(from / "config.json", dir / "config.json");
  std::filesystem::copy_file(from / "expected.json", dir / "expected.json");
  const std::string file = read_bytes(from / "model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  nlohmann::json header = nlohmann::json::parse(file.substr(8, header_len));
  std::string data = file.substr(8 + header_len);
  const int32_t layers = nlohmann::json::parse(read_bytes(from / "config.json")).at("num_hidden_layers").get<int32_t>();
  size_t elements = 1;
  for (int64_t d : shape) elements *= static_cast<size_t>(d);
  for (int32_t l = 0; l < layers; ++l) {
    for (const auto& [suffix, value] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
      const size_t begin = data.size();
      for (size_t i = 0; i < elements; ++i) data.append(reinterpret_cast<const char*>(&value), 4);
      header["model.layers." + std::to_string(l) + ".self_attn." + suffix] = {
          {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    }
  }
  std::string header_text = header.dump();
  while (header_text.size() % 8 != 0) header_text += ' ';
  const uint64_t new_len = header_text.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&new_len), 8);
  out << header_text << data;
  return dir;
}

// Deletes the temp copy when the test ends.
struct TempDir {
  std::filesystem::path path;
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(CheckpointKvScales, FixtureCopyCarriesTheScales) {
  // Host only: the helper's copy binds with the scales and otherwise the same weights.
  TempDir copy{fixture_with_kv_scales("llama_f32", 0.25f, 0.125f, {1})};
  auto with = CpuModel::load(copy.path);
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  auto plain = CpuModel::load(source_dir() / "tests/fixtures/models/llama_f32");
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  ASSERT_EQ((*with)->weights().layers.size(), (*plain)->weights().layers.size());
  for (size_t l = 0; l < (*with)->weights().layers.size(); ++l) {
    EXPECT_EQ((*with)->weights().layers[l].k_scale, 0.25f) << l;
    EXPECT_EQ((*with)->weights().layers[l].v_scale, 0.125f) << l;
    EXPECT_EQ((*plain)->weights().layers[l].k_scale, 0.0f) << l;
  }
}

TEST(CheckpointKvScales, CudaLoadRejectsBadScalesWithTheCpuErrors) {
  // Binding (shared with the CPU) fails before anything touches the GPU.
  CudaModelOptions o;
  o.show_progress = false;
  o.kv_key_dtype = o.kv_value_dtype = DType::kFP8E4M3;
  TempDir negative{fixture_with_kv_scales("llama_f32", -1.0f, 0.5f)};
  auto a = CudaModel::load(negative.path, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("'model.layers.0.self_attn.k_scale' is -1"), std::string::npos)
      << a.status().to_string();
  TempDir nan{fixture_with_kv_scales("llama_f32", 0.5f, NAN)};
  auto b = CudaModel::load(nan.path, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("'model.layers.0.self_attn.v_scale' is nan"), std::string::npos)
      << b.status().to_string();
  TempDir vector{fixture_with_kv_scales("llama_f32", 0.5f, 0.5f, {2})};
  auto c = CudaModel::load(vector.path, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'model.layers.0.self_attn.k_scale' has shape [2]"), std::string::npos)
      << c.status().to_string();
}

TEST(CheckpointKvScales, UploadedWeightsCarryTheScales) {
  PAGODA_SKIP_WITHOUT_GPU();
  TempDir copy{fixture_with_kv_scales("llama_f32", 0.25f, 0.125f)};
  auto config = load_model_config(copy.path);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  auto checkpoint = Checkpoint::open(copy.path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  WeightLoadOptions bind;
  bind.f32_cache_bytes = 0;
  auto host = bind_model_weights(*config, std::make_shared<const Checkpoint>(std::move(checkpoint).value()), bind);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  auto weights = CudaModelWeights::upload(*config, *host, false);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  ASSERT_EQ(weights->layers.size(), size_t(config->num_layers));
  for (const CudaLayerWeights& l : weights->layers) {
    EXPECT_EQ(l.k_scale, 0.25f);
    EXPECT_EQ(l.v_scale, 0.125f);
  }
  auto random = CudaModelWeights::random(*config, 3);
  ASSERT_TRUE(random.ok());
  EXPECT_EQ(random->layers[0].k_scale, 0.0f);  // random weights: per-vector scales
}

// The fixture's prompt four times over (48 tokens: three blocks of 16, the
// pool's block table reversed), so attention reads many cached fp8 vectors.
std::vector<int32_t> scales_prompt(const std::string& fixture) {
  const std::vector<int32_t> once = fixture_prompt(source_dir() / "tests/fixtures/models" / fixture);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), once.begin(), once.end());
  return prompt;
}

// Prefill of `prompt` (logits of every token), then kDecodeSteps
// teacher-forced decode steps (CUDA graphs on the GPU); every step's logits.
constexpr int32_t kDecodeSteps = 4;

template <typename Model, typename Pool>
StatusOr<std::vector<std::vector<float>>> prefill_and_decode(Model& model, Pool& pool,
                                                             const std::vector<int32_t>& prompt) {
  std::vector<std::vector<float>> steps;
  int32_t cached = 0;
  std::vector<int32_t> tokens = prompt;
  for (int32_t step = 0; step <= kDecodeSteps; ++step) {
    const ForwardBatch b = one_sequence_step(tokens, cached, true);
    std::vector<float> logits;
    PAGODA_RETURN_IF_ERROR(model.forward(b, pool, logits));
    cached += static_cast<int32_t>(tokens.size());
    tokens = {prompt[static_cast<size_t>(step) % prompt.size()]};  // teacher-forced: the same on both
    steps.push_back(std::move(logits));
  }
  return steps;
}

StatusOr<std::vector<std::vector<float>>> cpu_fp8_logits(const std::filesystem::path& dir,
                                                         const std::vector<int32_t>& prompt) {
  PAGODA_ASSIGN_OR_RETURN(auto model, CpuModel::load(dir));
  PAGODA_ASSIGN_OR_RETURN(CpuKvPool pool, CpuKvPool::create(model->kv_pool_shape(kNumBlocks, kBlockSize,
                                                                                  DType::kFP8E4M3, DType::kFP8E4M3)));
  return prefill_and_decode(*model, pool, prompt);
}

StatusOr<std::vector<std::vector<float>>> gpu_fp8_logits(const std::filesystem::path& dir,
                                                         const std::vector<int32_t>& prompt) {
  const CudaModelOptions o = test_options(DType::kFP8E4M3);
  PAGODA_ASSIGN_OR_RETURN(auto model, CudaModel::load(dir, o));
  PAGODA_ASSIGN_OR_RETURN(auto pool, CudaKvPool::create(model->kv_pool_shape(kNumBlocks)));
  return prefill_and_decode(*model, *pool, prompt);
}

// max over steps of max |a - b| / (kAbsTol + kRelTol * max |b|), cuda_model_test.cpp's bound.
double worst_over_bound(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  constexpr double kAbsTol = 0.02, kRelTol = 0.02;
  double worst = 0;
  for (size_t step = 0; step < b.size(); ++step) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < b[step].size(); ++i) {
      const double d = std::abs(static_cast<double>(a[step][i]) - b[step][i]);
      diff = std::isnan(d) ? 1e30 : std::max(diff, d);
      scale = std::max(scale, static_cast<double>(std::abs(b[step][i])));
    }
    worst = std::max(worst, diff / (kAbsTol + kRelTol * scale));
  }
  return worst;
}

// The GPU vs CPU comparison with a checkpoint's scales. The fixture has bf16
// weights, so both backends use the same weights and differ only in the GPU's
// bf16 activations. Those move some K / V values across an fp8 rounding
// boundary, and each such code flips by a whole fp8 step (1/8 to 1/16
// relative): with unclipped scales (and with the per-vector scales already
// shipped) the logits then differ by more than the bf16 bound. Emulating the
// GPU's bf16 roundings in CpuModel on six committed fixtures gave 0.85 to
// 2.2 x the bound for unclipped scales, 0.35 to 0.74 x where the scales clip
// the tails, 0.17 to 0.34 x where they clip most values (a clipped code cannot
// flip). Clipping scales therefore get the usual bound, and they also tell
// the scales apart from the per-vector path (test below); the unclipped pair
// gets 3 x (emulated 1.41 x on this fixture).
constexpr const char* kScaleFixture = "mistral_bf16";
struct ScaleCase {
  float k_scale, v_scale;
  double bound_factor;  // times cuda_model_test.cpp's bound
  const char* what;
};
constexpr ScaleCase kScaleCases[] = {
    {0.0005f, 0.0002f, 1.0, "clips most of K and V"},
    {0.002f, 0.002f, 1.0, "clips the tails"},
    {0.05f, 0.05f, 3.0, "no clipping"},
};

TEST(CheckpointKvScales, ClippingScalesMoveTheCpuLogitsPastTheGpuBound) {
  // Host only. A GPU that ignored the scales would give the per-vector logits,
  // so the GPU test below can only catch that if the clipping scales move the
  // CPU's logits by several times its bound.
  const std::filesystem::path dir = source_dir() / "tests/fixtures/models" / kScaleFixture;
  const std::vector<int32_t> prompt = scales_prompt(kScaleFixture);
  auto per_vector = cpu_fp8_logits(dir, prompt);
  ASSERT_TRUE(per_vector.ok()) << per_vector.status().to_string();
  for (const ScaleCase& c : kScaleCases) {
    TempDir copy{fixture_with_kv_scales(kScaleFixture, c.k_scale, c.v_scale)};
    auto fixed = cpu_fp8_logits(copy.path, prompt);
    ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
    const double moved = worst_over_bound(*fixed, *per_vector);
    std::cout << "[ figure ] " << kScaleFixture << " CPU fp8 KV, checkpoint scales k " << c.k_scale << " v "
              << c.v_scale << " (" << c.what << ") vs per-vector scales: error / GPU bound " << moved << "\n";
    EXPECT_NE(*fixed, *per_vector) << c.what;  // the scales are used
    if (c.bound_factor == 1.0) {
      EXPECT_GT(moved, 4.0) << c.what;
    }
  }
}

TEST(CheckpointKvScales, GpuFp8LogitsMatchTheCpuWithTheSameScales) {
  PAGODA_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> prompt = scales_prompt(kScaleFixture);
  for (const ScaleCase& c : kScaleCases) {
    TempDir copy{fixture_with_kv_scales(kScaleFixture, c.k_scale, c.v_scale)};
    auto cpu = cpu_fp8_logits(copy.path, prompt);
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    auto gpu = gpu_fp8_logits(copy.path, prompt);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    ASSERT_EQ(gpu->size(), cpu->size());
    const double error = worst_over_bound(*gpu, *cpu);
    std::cout << "[ figure ] " << kScaleFixture << " fp8 KV with checkpoint scales k " << c.k_scale << " v "
              << c.v_scale << " (" << c.what << "): GPU vs CPU worst error / bound " << error << " (allowed "
              << c.bound_factor << ")\n";
    EXPECT_LE(error, c.bound_factor) << c.what;
  }
}

}  // namespace
}  // namespace pagoda::cuda
