// DeepSeek V2/V3 on the CPU reference against transformers (the fixtures of
// tools/make_deepseek_fixtures.py) beyond what reference_models_test runs on
// every fixture (block sizes 16 and 3): blocks of one token, chunked prefill,
// bf16 / fp8 / int8 latent pools within measured bounds, a poisoned pool, shared
// prefix blocks and copy-on-write forks over the latent pool, checkpoints with
// fused experts or the Hub's rope_scaling spelling, and a missing expert named.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/testing/tiny_checkpoint.h"
#include "pagoda/backend/cpu/cpu_model.h"
#include "pagoda/backend/cpu/cpu_model_runner.h"
#include "pagoda/backend/cpu/kernels/logprobs.h"
#include "pagoda/backend/cpu/random_cpu_model.h"
#include "pagoda/model/safetensors_file.h"
#include "pagoda/backend/cpu/kernels/bf16_gemm.h"

namespace pagoda {
namespace {

// These tests hold the CPU to transformers at f32 precision, so f16/bf16 prefill runs
// the exact GEMM (weights widened to f32), not the bf16-activation one; that one is
// bounded against this path by tests/eval/bf16_prefill_test.cpp.
[[maybe_unused]] const bool kExactGemm = (kernels::set_bf16_gemm_enabled(false), true);

using ::testing::HasSubstr;

const char* const kFixtures[] = {"deepseek_v2_lite_bf16", "deepseek_v2_group_yarn_f32", "deepseek_v3_bf16",
                                 "deepseek_v3_latent512_bf16"};

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(PAGODA_SOURCE_DIR) / "tests" / "fixtures" / "models" / name;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

struct Settings {
  int32_t block_size = 16;
  DType kv_dtype = DType::kF32;
  int32_t prefill_chunk = 0;  // > 0: the prompt in chunks of this many tokens
  bool poison = false;        // NaN in every slot of an f32 latent pool first
};

struct Outcome {
  int32_t greedy_agreement = 0;   // steps where our argmax is transformers' token
  double max_top5_error = 0.0;    // over the prompt's and every step's top-5
  std::vector<std::vector<float>> step_logits;
};

// Runs prompt + transformers' greedy tokens (teacher-forced, so a quantized
// cache is measured on the same inputs at every step) through the paged pool
// with scattered block ids; compares each step's logprobs.
Outcome run(CpuModel& model, const nlohmann::json& expected, const Settings& s) {
  const auto prompt = expected["prompt_ids"].get<std::vector<int32_t>>();
  const auto greedy = expected["greedy_tokens"].get<std::vector<int32_t>>();
  const int32_t total = static_cast<int32_t>(prompt.size() + greedy.size());
  const int32_t blocks = (total + s.block_size - 1) / s.block_size;
  auto pool = CpuKvPool::create(model.kv_pool_shape(blocks + 3, s.block_size, s.kv_dtype, s.kv_dtype));
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return {};
  if (s.poison) {
    for (int32_t l = 0; l < pool->shape().num_layers; ++l) {
      kernels::PagedKvLayer layer = pool->layer(l);
      EXPECT_EQ(layer.value, nullptr);  // a latent pool has no V
      std::fill_n(layer.key_f32(), static_cast<size_t>(pool->shape().num_blocks) * pool->shape().elements_per_block(),
                  std::numeric_limits<float>::quiet_NaN());
    }
  }
  SequenceSlice seq;
  for (int32_t b = blocks + 2; b >= 3; --b) seq.block_table.push_back(b);  // reversed, skipping 0..2

  Outcome out;
  std::vector<float> logits, logprobs;
  const auto compare = [&](const nlohmann::json& top5) {
    logprobs.resize(logits.size());
    kernels::log_softmax(logits.data(), logprobs.data(), logits.size());
    for (const auto& pair : top5)
      out.max_top5_error = std::max(out.max_top5_error,
                                    std::abs(logprobs[pair[0].get<size_t>()] - pair[1].get<double>()));
  };
  // Prompt, in chunks.
  const int32_t chunk = s.prefill_chunk > 0 ? s.prefill_chunk : static_cast<int32_t>(prompt.size());
  int32_t done = 0;
  while (done < static_cast<int32_t>(prompt.size())) {
    const int32_t n = std::min<int32_t>(chunk, static_cast<int32_t>(prompt.size()) - done);
    ForwardBatch batch;
    batch.token_ids.assign(prompt.begin() + done, prompt.begin() + done + n);
    for (int32_t i = 0; i < n; ++i) batch.positions.push_back(done + i);
    seq.num_cached_tokens = done;
    seq.num_new_tokens = n;
    batch.sequences = {seq};
    const Status status = model.forward(batch, *pool, logits);
    EXPECT_TRUE(status.ok()) << status.to_string();
    done += n;
  }
  compare(expected["prompt_top5"]);
  for (size_t step = 0; step < greedy.size(); ++step) {
    if (step > 0) {
      ForwardBatch batch;
      batch.token_ids = {greedy[step - 1]};
      batch.positions = {done};
      seq.num_cached_tokens = done;
      seq.num_new_tokens = 1;
      batch.sequences = {seq};
      const Status status = model.forward(batch, *pool, logits);
      EXPECT_TRUE(status.ok()) << status.to_string();
      ++done;
    }
    compare(expected["top5"][step]);
    if (kernels::argmax(logits.data(), logits.size()) == greedy[step]) ++out.greedy_agreement;
    out.step_logits.push_back(logits);
  }
  return out;
}

std::unique_ptr<CpuModel> load(const std::filesystem::path& dir) {
  auto model = CpuModel::load(dir);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(DeepseekReferenceTest, BlocksOfOneTokenAndChunkedPrefillMatchTransformers) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto model = load(fixture_dir(name));
    ASSERT_NE(model, nullptr);
    const auto expected = read_json(fixture_dir(name) / "expected.json");
    for (const Settings& s : {Settings{1}, Settings{3, DType::kF32, 5}, Settings{16, DType::kF32, 1}}) {
      const Outcome o = run(*model, expected, s);
      EXPECT_EQ(o.greedy_agreement, 24) << "block size " << s.block_size << " chunk " << s.prefill_chunk;
      EXPECT_LT(o.max_top5_error, 1e-3) << "block size " << s.block_size << " chunk " << s.prefill_chunk;
    }
  }
}

// Quantized latent caches, measured against transformers' f32 outputs on the
// same (teacher-forced) inputs. These tiny random models are far more sensitive
// than trained ones (transformers itself in bf16 moves their top-5 logprobs by
// up to 1.2), so the bounds are per fixture: the measured error (docs/MLA.md)
// with about 25% headroom for summation order, and the measured greedy
// agreement less one step for a near-tie. fp8 is the latent pool's record
// (runtime/mla_fp8_layout.h: a scale per 128 latent values, the rope key in bf16).
TEST(DeepseekReferenceTest, QuantizedLatentCachesStayWithinMeasuredBounds) {
  struct Bound {
    const char* fixture;
    DType dtype;
    double max_error;
    int32_t min_agreement;
  };
  const Bound bounds[] = {
      {"deepseek_v2_lite_bf16", DType::kBF16, 0.03, 23},      {"deepseek_v2_lite_bf16", DType::kFP8E4M3, 0.33, 22},
      {"deepseek_v2_lite_bf16", DType::kInt8, 0.035, 22},     {"deepseek_v2_group_yarn_f32", DType::kBF16, 0.03, 23},
      {"deepseek_v2_group_yarn_f32", DType::kFP8E4M3, 1.77, 23}, {"deepseek_v2_group_yarn_f32", DType::kInt8, 0.05, 23},
      {"deepseek_v3_bf16", DType::kBF16, 0.03, 23},           {"deepseek_v3_bf16", DType::kFP8E4M3, 0.95, 22},
      {"deepseek_v3_bf16", DType::kInt8, 0.44, 23},           {"deepseek_v3_latent512_bf16", DType::kBF16, 0.03, 23},
      {"deepseek_v3_latent512_bf16", DType::kFP8E4M3, 1.57, 22}, {"deepseek_v3_latent512_bf16", DType::kInt8, 1.53, 22},
  };
  std::string loaded_name;
  std::unique_ptr<CpuModel> model;
  nlohmann::json expected;
  for (const Bound& b : bounds) {
    if (loaded_name != b.fixture) {
      model = load(fixture_dir(b.fixture));
      ASSERT_NE(model, nullptr);
      expected = read_json(fixture_dir(b.fixture) / "expected.json");
      loaded_name = b.fixture;
    }
    const Outcome o = run(*model, expected, {16, b.dtype});
    std::printf("%s latent %s: max |top-5 logprob error| %.4f, greedy agreement %d/24\n", b.fixture,
                std::string(dtype_name(b.dtype)).c_str(), o.max_top5_error, o.greedy_agreement);
    EXPECT_LT(o.max_top5_error, b.max_error) << b.fixture << " " << dtype_name(b.dtype);
    EXPECT_GE(o.greedy_agreement, b.min_agreement) << b.fixture << " " << dtype_name(b.dtype);
  }
}

// Tenant hygiene on the latent pool: every slot starts as NaN; attention must
// read only the slots this sequence wrote (blocks of 3 leave the last block
// partly unwritten at most steps).
TEST(DeepseekReferenceTest, NeverReadsLatentSlotsTheSequenceDidNotWrite) {
  for (const char* name : {"deepseek_v2_lite_bf16", "deepseek_v3_latent512_bf16"}) {
    SCOPED_TRACE(name);
    auto model = load(fixture_dir(name));
    ASSERT_NE(model, nullptr);
    const Outcome o = run(*model, read_json(fixture_dir(name) / "expected.json"), {3, DType::kF32, 0, true});
    EXPECT_EQ(o.greedy_agreement, 24);
    EXPECT_LT(o.max_top5_error, 1e-3);
  }
}

// A prefix-cache hit: sequence B's block table starts with A's full blocks (its
// first 8 tokens, blocks of 4) and computes only the rest, in one batch with A's
// next decode step; B's logits equal a run without sharing. Then a
// copy-on-write fork of A's partial last block continues exactly like A.
void shared_prefix_and_fork(const std::string& name, DType kv_dtype, double hit_tolerance) {
  auto loaded = load(fixture_dir(name));
  ASSERT_NE(loaded, nullptr);
  std::shared_ptr<CpuModel> model(std::move(loaded));
  const auto prompt = read_json(fixture_dir(name) / "expected.json")["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 11u);
  auto runner = CpuModelRunner::create(model, 32, 4, kv_dtype, kv_dtype);
  ASSERT_TRUE(runner.ok()) << runner.status().to_string();
  const auto positions = [](int32_t first, int32_t n) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < n; ++i) p.push_back(first + i);
    return p;
  };
  // A: the first 11 prompt tokens in blocks 5, 6, 7.
  SequenceSlice a;
  a.num_new_tokens = 11;
  a.block_table = {5, 6, 7};
  ForwardBatch first;
  first.token_ids.assign(prompt.begin(), prompt.begin() + 11);
  first.positions = positions(0, 11);
  first.sequences = {a};
  auto step_a = (*runner)->execute(first, {});
  ASSERT_TRUE(step_a.ok()) << step_a.status().to_string();

  // B shares blocks 5 and 6 (8 cached tokens) and computes its tokens 8..10 in block 9;
  // A decodes token 11 in the same batch.
  SequenceSlice a_next = a;
  a_next.token_offset = 0;
  a_next.num_cached_tokens = 11;
  a_next.num_new_tokens = 1;
  SequenceSlice b;
  b.token_offset = 1;
  b.num_cached_tokens = 8;
  b.num_new_tokens = 3;
  b.block_table = {5, 6, 9};
  ForwardBatch mixed;
  mixed.token_ids = {prompt[11 % prompt.size()], prompt[8], prompt[9], prompt[10]};
  mixed.positions = {11, 8, 9, 10};
  mixed.sequences = {a_next, b};
  auto step_mixed = (*runner)->execute(mixed, {});
  ASSERT_TRUE(step_mixed.ok()) << step_mixed.status().to_string();
  const size_t vocab = static_cast<size_t>(model->config().vocab_size);
  ASSERT_EQ(step_mixed->host_logits.size(), 2 * vocab);
  // B after its prompt sees what A saw after the same 11 tokens.
  for (size_t i = 0; i < vocab; ++i)
    EXPECT_NEAR(step_mixed->host_logits[vocab + i], step_a->host_logits[i], hit_tolerance) << "token " << i;

  // Fork A (12 tokens: block 7 holds tokens 8..11, full) after copying block 7 to 12; both decode the same token.
  ASSERT_TRUE((*runner)->copy_blocks(std::vector<runtime::BlockCopy>{{7, 12}}).ok());
  SequenceSlice original = a;
  original.num_cached_tokens = 12;
  original.num_new_tokens = 1;
  original.block_table = {5, 6, 7, 13};
  SequenceSlice fork = original;
  fork.token_offset = 1;
  fork.block_table = {5, 6, 12, 14};
  ForwardBatch both;
  both.token_ids = {7, 7};
  both.positions = {12, 12};
  both.sequences = {original, fork};
  auto step_both = (*runner)->execute(both, {});
  ASSERT_TRUE(step_both.ok()) << step_both.status().to_string();
  for (size_t i = 0; i < vocab; ++i)
    EXPECT_FLOAT_EQ(step_both->host_logits[vocab + i], step_both->host_logits[i]) << "token " << i;
}

TEST(DeepseekReferenceTest, SharedPrefixBlocksAndCopyOnWriteForksOnTheLatentPool) {
  shared_prefix_and_fork("deepseek_v3_bf16", DType::kF32, 1e-4);
}

// The same on fp8 latent pools (runtime/mla_fp8_layout.h's records: 656 B a token
// for the real 512 + 64 dims, 64 B for the tiny 32 + 8): a prefix hit reads the
// records the miss wrote, so the logits agree as closely as on an f32 pool.
TEST(DeepseekReferenceTest, PrefixHitEqualsMissOnFp8LatentRecords) {
  for (const char* name : {"deepseek_v3_bf16", "deepseek_v3_latent512_bf16"}) {
    SCOPED_TRACE(name);
    shared_prefix_and_fork(name, DType::kFP8E4M3, 1e-4);
  }
}

// fp8 latent records at blocks of 64 (FlashMLA's), 16 and 1 token: the same bytes
// per token wherever the block boundaries fall, so the same logits at every step.
TEST(DeepseekReferenceTest, Fp8LatentRecordsGiveTheSameLogitsAtBlocksOf64_16And1) {
  for (const char* name : {"deepseek_v2_lite_bf16", "deepseek_v3_latent512_bf16"}) {
    SCOPED_TRACE(name);
    auto model = load(fixture_dir(name));
    ASSERT_NE(model, nullptr);
    const nlohmann::json expected = read_json(fixture_dir(name) / "expected.json");
    const Outcome at64 = run(*model, expected, {64, DType::kFP8E4M3});
    ASSERT_EQ(at64.step_logits.size(), 24u);
    for (int32_t block : {16, 1}) {
      const Outcome o = run(*model, expected, {block, DType::kFP8E4M3});
      ASSERT_EQ(o.step_logits.size(), at64.step_logits.size());
      EXPECT_EQ(o.greedy_agreement, at64.greedy_agreement) << "block " << block;
      for (size_t step = 0; step < o.step_logits.size(); ++step)
        for (size_t i = 0; i < o.step_logits[step].size(); ++i)
          ASSERT_NEAR(o.step_logits[step][i], at64.step_logits[step][i], 1e-4)
              << "block " << block << " step " << step << " token " << i;
    }
  }
}

// Every tensor of a fixture's safetensors as f32 values in its own dtype (exact on rewrite).
testing::TensorMap read_tensors(const std::filesystem::path& file) {
  testing::TensorMap map;
  auto st = SafetensorsFile::open(file);
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  if (!st.ok()) return map;
  for (const TensorInfo& t : st->tensors()) {
    testing::TensorToWrite w;
    w.dtype = t.dtype;
    w.shape = t.shape;
    w.values.resize(static_cast<size_t>(t.num_elements()));
    convert_to_f32(t.dtype, t.data, w.values.data(), w.values.size());
    map[t.name] = std::move(w);
  }
  return map;
}

TEST(DeepseekCheckpointTest, MissingExpertTensorIsNamed) {
  const auto dir = testing::make_temp_dir("deepseek_missing_expert");
  auto tensors = read_tensors(fixture_dir("deepseek_v3_bf16") / "model.safetensors");
  ASSERT_EQ(tensors.erase("model.layers.2.mlp.experts.5.up_proj.weight"), 1u);
  testing::write_model_dir(dir, read_json(fixture_dir("deepseek_v3_bf16") / "config.json"), tensors);
  auto model = CpuModel::load(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(), HasSubstr("model.layers.2.mlp.experts.5.up_proj.weight"));
  EXPECT_THAT(model.status().message(), HasSubstr("[32, 64]"));
  std::filesystem::remove_all(dir);
}

// The experts as transformers holds them in memory (gate_up_proj [E, 2I, H],
// down_proj [E, H, I]) load to the same model; the V3 correction bias may be f32
// beside bf16 weights, as the Hub's checkpoints store it.
TEST(DeepseekCheckpointTest, FusedExpertsAndAnF32CorrectionBiasLoadToTheSameModel) {
  const std::string name = "deepseek_v3_bf16";
  const auto config = read_json(fixture_dir(name) / "config.json");
  auto tensors = read_tensors(fixture_dir(name) / "model.safetensors");
  const auto experts = config["n_routed_experts"].get<int64_t>();
  const auto inter = config["moe_intermediate_size"].get<int64_t>();
  const auto hidden = config["hidden_size"].get<int64_t>();
  const auto layers = config["num_hidden_layers"].get<int32_t>();
  for (int32_t layer = config["first_k_dense_replace"].get<int32_t>(); layer < layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
    testing::TensorToWrite gate_up{DType::kBF16, {experts, 2 * inter, hidden}, {}};
    testing::TensorToWrite down{DType::kBF16, {experts, hidden, inter}, {}};
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      for (const char* part : {"gate_proj", "up_proj"}) {
        auto& t = tensors.at(x + part + ".weight");
        gate_up.values.insert(gate_up.values.end(), t.values.begin(), t.values.end());
        tensors.erase(x + part + ".weight");
      }
      auto& d = tensors.at(x + "down_proj.weight");
      down.values.insert(down.values.end(), d.values.begin(), d.values.end());
      tensors.erase(x + "down_proj.weight");
    }
    tensors[p + "experts.gate_up_proj"] = std::move(gate_up);
    tensors[p + "experts.down_proj"] = std::move(down);
    tensors.at(p + "gate.e_score_correction_bias").dtype = DType::kF32;
  }
  const auto dir = testing::make_temp_dir("deepseek_fused");
  testing::write_model_dir(dir, config, tensors);  // config.json still says bfloat16
  auto fused = load(dir);
  auto original = load(fixture_dir(name));
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(original, nullptr);
  const auto expected = read_json(fixture_dir(name) / "expected.json");
  const Outcome a = run(*fused, expected, {});
  const Outcome b = run(*original, expected, {});
  ASSERT_EQ(a.step_logits.size(), b.step_logits.size());
  for (size_t s = 0; s < a.step_logits.size(); ++s)
    for (size_t i = 0; i < a.step_logits[s].size(); ++i) ASSERT_EQ(a.step_logits[s][i], b.step_logits[s][i]);
  std::filesystem::remove_all(dir);
}

// The Hub's configs spell the rope as rope_theta + rope_scaling {"type": "yarn", ...}.
TEST(DeepseekCheckpointTest, HubRopeScalingSpellingGivesTheSameOutputs) {
  const std::string name = "deepseek_v2_group_yarn_f32";
  nlohmann::json config = read_json(fixture_dir(name) / "config.json");
  nlohmann::json scaling = config["rope_parameters"];
  config["rope_theta"] = scaling["rope_theta"];
  scaling.erase("rope_theta");
  scaling.erase("rope_type");
  scaling["type"] = "yarn";
  config.erase("rope_parameters");
  config["rope_scaling"] = scaling;
  const auto dir = testing::make_temp_dir("deepseek_hub_rope");
  std::filesystem::copy_file(fixture_dir(name) / "model.safetensors", dir / "model.safetensors");
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(2);
  }
  auto model = load(dir);
  ASSERT_NE(model, nullptr);
  const Outcome o = run(*model, read_json(fixture_dir(name) / "expected.json"), {});
  EXPECT_EQ(o.greedy_agreement, 24);
  EXPECT_LT(o.max_top5_error, 1e-3);
  std::filesystem::remove_all(dir);
}

TEST(DeepseekCheckpointTest, LatentPoolRefusesSeparateKeyAndValueDtypes) {
  auto model = load(fixture_dir("deepseek_v2_lite_bf16"));
  ASSERT_NE(model, nullptr);
  auto pool = CpuKvPool::create(model->kv_pool_shape(4, 16, DType::kInt8, DType::kInt4));
  ASSERT_FALSE(pool.ok());
  EXPECT_THAT(pool.status().message(), HasSubstr("MLA latent pool"));
}

// --load-format random for a DeepSeek config: reproducible from the seed, and the
// whole prompt in one prefill gives the logits a token-by-token decode gives.
TEST(DeepseekRandomWeightsTest, SeededAndPrefillEqualsDecode) {
  auto config = parse_model_config(read_json(fixture_dir("deepseek_v3_bf16") / "config.json"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const std::vector<int32_t> prompt = {5, 17, 42, 8, 90, 3, 3, 200, 11};
  const auto last_logits = [&](CpuModel& model, bool one_by_one) {
    auto pool = CpuKvPool::create(model.kv_pool_shape(4, 4));
    EXPECT_TRUE(pool.ok());
    std::vector<float> logits;
    SequenceSlice seq;
    seq.block_table = {3, 1, 2};
    const int32_t step = one_by_one ? 1 : static_cast<int32_t>(prompt.size());
    for (int32_t done = 0; done < static_cast<int32_t>(prompt.size()); done += step) {
      ForwardBatch batch;
      batch.token_ids.assign(prompt.begin() + done, prompt.begin() + done + step);
      for (int32_t i = 0; i < step; ++i) batch.positions.push_back(done + i);
      seq.num_cached_tokens = done;
      seq.num_new_tokens = step;
      batch.sequences = {seq};
      EXPECT_TRUE(model.forward(batch, *pool, logits).ok());
    }
    return logits;
  };
  auto a = make_random_cpu_model(*config, 7, size_t{1} << 30);
  auto b = make_random_cpu_model(*config, 7, size_t{1} << 30);
  auto other = make_random_cpu_model(*config, 8, size_t{1} << 30);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok()) << a.status().to_string();
  const auto prefill = last_logits(**a, false);
  const auto decode = last_logits(**a, true);
  ASSERT_EQ(prefill.size(), static_cast<size_t>(config->vocab_size));
  for (size_t i = 0; i < prefill.size(); ++i) EXPECT_NEAR(prefill[i], decode[i], 1e-5) << "token " << i;
  EXPECT_EQ(last_logits(**b, false), prefill);
  EXPECT_NE(last_logits(**other, false), prefill);
  auto too_big = make_random_cpu_model(*config, 7, 1024);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pagoda
