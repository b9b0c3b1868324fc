// The whole model on the GPU with a quantized KV cache: free-running greedy
// decoding with int8 (and fp8) KV gives the same tokens as bf16 KV for at least
// the first 8 tokens on the committed fixtures and the bundled model; a
// divergence is only accepted at a near tie of the bf16 run (top-1 margin under
// kMarginTol). int4 is reported, not asserted. Prints the divergence step and
// the logit gap per format as figures. And kernels/cuda's quantized decode in
// the model against the builtin kernel on the same codes.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/model/model_config.h"

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
StatusOr<Run> greedy(const std::filesystem::path& dir, const std::vector<int32_t>& prompt, DType kv_dtype) {
  CudaModelOptions o;
  o.max_num_tokens = 256;
  o.max_num_seqs = 4;
  o.max_model_len = 512;
  o.block_size = kBlockSize;
  o.show_progress = false;
  o.kv_key_dtype = o.kv_value_dtype = kv_dtype;
  PAGODA_ASSIGN_OR_RETURN(auto model, CudaModel::load(dir, o));
  PAGODA_ASSIGN_OR_RETURN(auto pool, CudaKvPool::create(model->kv_pool_shape(kNumBlocks)));
  std::vector<int32_t> table(kNumBlocks);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());  // not the identity
  Run run;
  std::vector<int32_t> step_tokens = prompt;
  int32_t cached = 0;
  for (int32_t step = 0; step < kSteps; ++step) {
    ForwardBatch b;
    b.token_ids = step_tokens;
    for (size_t i = 0; i < step_tokens.size(); ++i) b.positions.push_back(cached + static_cast<int32_t>(i));
    SequenceSlice s;
    s.num_new_tokens = static_cast<int32_t>(step_tokens.size());
    s.num_cached_tokens = cached;
    s.block_table = table;
    b.sequences.push_back(s);
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

// kernels/cuda's quantized decode inside the model (head_dim 128, eager and
// CUDA-graph steps) against the builtin kernel on the same quantized KV: both
// read the same codes, so only the kernels' arithmetic differs (f16 q and p on
// tensor cores vs bf16 tiles).
TEST(QuantizedKvModel, FastDecodeMatchesBuiltinAttentionOnTheSameCodes) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "kernels/cuda not built";
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

}  // namespace
}  // namespace pagoda::cuda
