// Tensor parallelism on the GPU (docs/TENSOR_PARALLEL.md), testable on ONE GPU:
// the same-device communicator (N ranks on one device, collectives in rank
// order) against host sums bit for bit, and the sharded CUDA forward at TP=2
// and TP=4 over it against TP=1 on the same GPU on the llama-family fixtures
// (bf16 weights and activations): logits within a measured bound of TP=1,
// greedy tokens equal wherever TP=1's top-1 margin is clear of that bound,
// a batch of two sequences (a decode beside a prompt), on-device sampling, an
// fp8 KV cache, bitwise-repeatable TP=N runs, and the errors.

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/backend/cuda/cuda_tensor_parallel_runner.h"
#include "pagoda/backend/cuda/same_device_communicator.h"
#include "pagoda/model/checkpoint.h"
#include "pagoda/model/model_config.h"

namespace pagoda::cuda {
namespace {

using testing::to_device;
using testing::to_host;

constexpr int32_t kBlockSize = 16;
// Logits of TP=N against TP=1 (same GPU, bf16): |a - b| <= kRelativeBound * max(1, max |logit| of the row).
// The ranks round their partial o / down outputs to bf16 before the sum and
// split the GEMMs' reductions, so TP=N is not bitwise TP=1.
constexpr double kRelativeBound = 0.02;
constexpr double kFp8RelativeBound = 0.05;

// to_device's copies run on the legacy default stream, which the ranks' non-blocking streams do not
// wait for: a rank waits for them before it hands its buffers to a collective.
void wait_for_uploads() { ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess); }

// Runs job(r) on `n` threads at once (rank 0 included) and joins them.
void on_threads(int32_t n, const std::function<void(int32_t)>& job) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r) threads.emplace_back(job, r);
  for (auto& t : threads) t.join();
}

// ---- the same-device communicator -----------------------------------------------------------------------

TEST(SameDeviceCommunicatorTest, AllReduceSumsInRankOrderBitForBit) {
  PAGODA_SKIP_WITHOUT_GPU();
  for (int32_t n = 1; n <= 4; ++n) {
    auto comms = make_same_device_communicators(n, 0);
    ASSERT_TRUE(comms.ok()) << comms.status().to_string();
    const size_t count = 1000 + 37 * static_cast<size_t>(n);
    std::vector<std::vector<float>> f32(static_cast<size_t>(n));
    std::vector<std::vector<uint16_t>> bf16(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
    for (int32_t r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) {
        f32[static_cast<size_t>(r)].push_back(dist(rng) * std::pow(10.0f, static_cast<float>(i % 7) - 3.0f));
        bf16[static_cast<size_t>(r)].push_back(f32_to_bf16(dist(rng)));
      }
    std::vector<float> want_f32(count, 0.0f);
    std::vector<uint16_t> want_bf16(count);
    for (size_t i = 0; i < count; ++i) {
      float s = 0.0f, b = 0.0f;
      for (int32_t r = 0; r < n; ++r) {
        s += f32[static_cast<size_t>(r)][i];
        b += bf16_to_f32(bf16[static_cast<size_t>(r)][i]);
      }
      want_f32[i] = s;
      want_bf16[i] = f32_to_bf16(b);
    }
    std::vector<std::vector<float>> got_f32(static_cast<size_t>(n));
    std::vector<std::vector<uint16_t>> got_bf16(static_cast<size_t>(n));
    std::vector<Status> status(static_cast<size_t>(n), ok_status());
    on_threads(n, [&](int32_t r) {
      const size_t i = static_cast<size_t>(r);
      cudaSetDevice(0);
      DeviceBuffer a = to_device(f32[i]);
      DeviceBuffer b = to_device(bf16[i]);
      wait_for_uploads();
      // One collective through the blocking call, one enqueued on a stream of the rank's own.
      status[i] = (*comms)[i]->all_reduce_sum(a.data(), count, DType::kF32);
      cudaStream_t stream = nullptr;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      if (status[i].ok()) status[i] = (*comms)[i]->enqueue_all_reduce_sum(b.data(), count, DType::kBF16, stream);
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
      got_f32[i] = to_host<float>(a, count);
      got_bf16[i] = to_host<uint16_t>(b, count);
    });
    for (int32_t r = 0; r < n; ++r) {
      const size_t i = static_cast<size_t>(r);
      ASSERT_TRUE(status[i].ok()) << status[i].to_string();
      EXPECT_EQ(std::memcmp(got_f32[i].data(), want_f32.data(), count * 4), 0) << "f32, rank " << r << " of " << n;
      EXPECT_EQ(got_bf16[i], want_bf16) << "bf16, rank " << r << " of " << n;
    }
  }
}

TEST(SameDeviceCommunicatorTest, AllGatherBroadcastAndManyRounds) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t n = 4;
  auto comms = make_same_device_communicators(n, 0);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  const size_t count = 513;
  std::vector<int> failures(static_cast<size_t>(n), 0);
  on_threads(n, [&](int32_t r) {
    const size_t i = static_cast<size_t>(r);
    cudaSetDevice(0);
    auto& comm = *(*comms)[i];
    for (int round = 0; round < 50; ++round) {
      std::vector<float> mine(count);
      for (size_t k = 0; k < count; ++k) mine[k] = static_cast<float>(round * 10000 + r * 1000) + static_cast<float>(k);
      DeviceBuffer send = to_device(mine);
      DeviceBuffer recv = to_device(std::vector<float>(count * n, -1.0f));
      wait_for_uploads();
      if (!comm.all_gather(send.data(), recv.data(), count, DType::kF32).ok()) ++failures[i];
      const std::vector<float> all = to_host<float>(recv, count * n);
      for (int32_t k = 0; k < n; ++k)
        for (size_t e = 0; e < count; ++e)
          if (all[static_cast<size_t>(k) * count + e] != static_cast<float>(round * 10000 + k * 1000) + static_cast<float>(e))
            ++failures[i];
      const int32_t root = round % n;
      if (!comm.broadcast(send.data(), count, DType::kF32, root).ok()) ++failures[i];
      const std::vector<float> b = to_host<float>(send, count);
      for (size_t e = 0; e < count; ++e)
        if (b[e] != static_cast<float>(round * 10000 + root * 1000) + static_cast<float>(e)) ++failures[i];
      if (!comm.barrier().ok()) ++failures[i];
    }
  });
  for (int32_t r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], 0) << "rank " << r;
}

TEST(SameDeviceCommunicatorTest, DisagreementIsTheSameErrorOnEveryRankAndTheGroupGoesOn) {
  PAGODA_SKIP_WITHOUT_GPU();
  const int32_t n = 3;
  auto comms = make_same_device_communicators(n, 0);
  ASSERT_TRUE(comms.ok()) << comms.status().to_string();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<float> after(static_cast<size_t>(n), 0.0f);
  on_threads(n, [&](int32_t r) {
    const size_t i = static_cast<size_t>(r);
    cudaSetDevice(0);
    DeviceBuffer a = to_device(std::vector<float>(8, 1.0f));
    wait_for_uploads();
    const Status s = (*comms)[i]->all_reduce_sum(a.data(), r == 1 ? 4 : 8, DType::kF32);
    errors[i] = s.ok() ? "ok" : s.to_string();
    if ((*comms)[i]->all_reduce_sum(a.data(), 8, DType::kF32).ok()) after[i] = to_host<float>(a, 8)[7];
  });
  for (int32_t r = 0; r < n; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)], "ok");
    EXPECT_EQ(errors[static_cast<size_t>(r)], errors[0]);
    EXPECT_NE(errors[0].find("disagree"), std::string::npos) << errors[0];
    EXPECT_EQ(after[static_cast<size_t>(r)], 3.0f) << "rank " << r;
  }
  EXPECT_FALSE(make_same_device_communicators(0, 0).ok());
  EXPECT_FALSE(make_same_device_communicators(9, 0).ok());
  EXPECT_FALSE(make_same_device_communicators(2, 1 << 20).ok());
}

// ---- the sharded forward ----------------------------------------------------------------------------------

std::filesystem::path fixtures_dir() {
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  return std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/models";
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

struct Loaded {
  ModelConfig config;
  std::shared_ptr<const ModelWeights> weights;
};

Loaded load_whole(const std::filesystem::path& dir) {
  auto config = load_model_config(dir);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  auto checkpoint = Checkpoint::open(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  WeightLoadOptions options;
  options.f32_cache_bytes = 0;  // mmapped views, as CudaModel::load binds them
  auto weights = bind_model_weights(*config, std::make_shared<const Checkpoint>(std::move(*checkpoint)), options);
  EXPECT_TRUE(weights.ok()) << weights.status().to_string();
  return {*config, std::make_shared<const ModelWeights>(std::move(*weights))};
}

CudaTensorParallelOptions tp_options(int32_t num_blocks, DType kv = DType::kBF16) {
  CudaTensorParallelOptions o;
  o.model.max_num_tokens = 256;
  o.model.max_num_seqs = 8;
  o.model.max_model_len = 512;
  o.model.block_size = kBlockSize;
  o.model.show_progress = false;
  o.model.kv_key_dtype = kv;
  o.model.kv_value_dtype = kv;
  o.runner.num_blocks = num_blocks;
  o.runner.print_report = false;
  o.same_device = true;
  return o;
}

// TP=1: the plain CudaModelRunner over the same weights and options.
std::unique_ptr<runtime::ModelRunner> tp1_runner(const Loaded& m, const CudaTensorParallelOptions& o) {
  auto model = CudaModel::from_weights(m.config, *m.weights, o.model);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return nullptr;
  auto runner = CudaModelRunner::create(std::move(*model), o.runner);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  return runner.ok() ? std::move(*runner) : nullptr;
}

std::unique_ptr<CudaTensorParallelRunner> tpn_runner(const Loaded& m, int32_t size,
                                                     const CudaTensorParallelOptions& o) {
  auto runner = CudaTensorParallelRunner::create(m.config, m.weights, size, o);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  return runner.ok() ? std::move(*runner) : nullptr;
}

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// The gap between the largest and second largest logit.
double top1_margin(const std::vector<float>& row) {
  std::vector<float> sorted = row;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  return static_cast<double>(sorted[0]) - sorted[1];
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? 1e30 : std::max(diff, d);
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return diff / scale;
}

// One sequence: the prompt in one step, then decodes of `feed` (teacher forcing,
// so TP=N sees TP=1's context even past a near-tie); every step's logits.
std::vector<std::vector<float>> run_forced(runtime::ModelRunner& runner, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& feed) {
  const int32_t num_blocks = runner.kv_geometry().num_blocks;
  SequenceSlice seq;
  for (int32_t b = num_blocks - 1; b >= 0; --b) seq.block_table.push_back(b);  // scattered, last block first
  seq.num_new_tokens = static_cast<int32_t>(prompt.size());
  seq.logits_for_last_token = true;
  ForwardBatch batch;
  batch.token_ids = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) batch.positions.push_back(static_cast<int32_t>(i));
  batch.sequences = {seq};
  std::vector<std::vector<float>> out;
  int32_t context = 0;
  for (size_t step = 0; step <= feed.size(); ++step) {
    auto result = runner.execute(batch, {});
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    if (!result.ok()) break;
    out.push_back(result->host_logits);
    if (step == feed.size()) break;
    context += batch.num_tokens();
    batch.token_ids = {feed[step]};
    batch.positions = {context};
    batch.sequences[0].num_cached_tokens = context;
    batch.sequences[0].num_new_tokens = 1;
  }
  return out;
}

struct FixtureCase {
  std::string name;
  int32_t size;
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.name << " TP=" << c.size; }

class CudaTensorParallelFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(CudaTensorParallelFixtureTest, ReproducesTp1OnOneGpu) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto& [name, size] = GetParam();
  const auto dir = fixtures_dir() / name;
  const nlohmann::json expected = read_json(dir / "expected.json");
  const auto prompt = expected["prompt_ids"].get<std::vector<int32_t>>();
  const auto greedy = expected["greedy_tokens"].get<std::vector<int32_t>>();
  const int32_t num_blocks = static_cast<int32_t>((prompt.size() + greedy.size()) / kBlockSize) + 3;
  const Loaded whole = load_whole(dir);
  ASSERT_TRUE(whole.weights);
  const CudaTensorParallelOptions options = tp_options(num_blocks);
  auto tp1 = tp1_runner(whole, options);
  ASSERT_TRUE(tp1);
  auto tpn = tpn_runner(whole, size, options);
  ASSERT_TRUE(tpn);
  EXPECT_EQ(tpn->kv_geometry().num_blocks, num_blocks);
  EXPECT_EQ(tpn->size(), size);

  // TP=1's own greedy run (its tokens fed to both, so every step compares the same context).
  const std::vector<int32_t> feed(greedy.begin(), greedy.end() - 1);
  const auto reference = run_forced(*tp1, prompt, feed);
  const auto ours = run_forced(*tpn, prompt, feed);
  ASSERT_EQ(reference.size(), greedy.size());
  ASSERT_EQ(ours.size(), greedy.size());
  double worst = 0.0;
  int32_t equal = 0, clear = 0, transformers = 0;
  for (size_t step = 0; step < greedy.size(); ++step) {
    ASSERT_EQ(ours[step].size(), static_cast<size_t>(whole.config.vocab_size));
    const double diff = relative_difference(ours[step], reference[step]);
    worst = std::max(worst, diff);
    const int32_t want = argmax(reference[step]), got = argmax(ours[step]);
    equal += got == want;
    transformers += got == greedy[step];
    double scale = 1.0;
    for (float x : reference[step]) scale = std::max(scale, static_cast<double>(std::abs(x)));
    if (top1_margin(reference[step]) > 2.0 * kRelativeBound * scale) {
      ++clear;
      EXPECT_EQ(got, want) << name << " TP=" << size << " step " << step;
    }
  }
  EXPECT_LT(worst, kRelativeBound) << name << " TP=" << size;
  std::printf("%s TP=%d (one GPU): greedy argmax equal to TP=1 at %d/%zu steps (%d with a clear margin, all equal), "
              "to transformers at %d/%zu; max logit difference to TP=1 %.2e (relative)\n",
              name.c_str(), size, equal, greedy.size(), clear, transformers, greedy.size(), worst);

  // A second TP=N runner gives the same bits: the collectives sum in a fixed order.
  auto again = tpn_runner(whole, size, options);
  ASSERT_TRUE(again);
  const std::vector<int32_t> short_feed(feed.begin(), feed.begin() + 5);
  const auto repeat = run_forced(*again, prompt, short_feed);
  ASSERT_EQ(repeat.size(), short_feed.size() + 1);
  for (size_t step = 0; step < repeat.size(); ++step)
    EXPECT_EQ(std::memcmp(repeat[step].data(), ours[step].data(), repeat[step].size() * sizeof(float)), 0)
        << name << " TP=" << size << " step " << step << " is not reproducible";
}

std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> cases;
  for (const char* name : {"llama_f32", "llama3_rope_bf16", "llama_mqa_f16", "mistral_bf16", "mistral_sliding_bf16",
                           "qwen2_tied_bf16", "qwen3_sharded_f32"})
    for (int32_t size : {2, 4}) cases.push_back({name, size});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallelFixtureTest, ::testing::ValuesIn(fixture_cases()),
                         [](const auto& info) { return info.param.name + "_tp" + std::to_string(info.param.size); });

// Two sequences in one batch (a decode beside a whole prompt), all prompt rows' logits, and rows sampled on the
// device (greedy) against the host logits' argmax.
TEST(CudaTensorParallelTest, BatchOfTwoSequencesAndDeviceSampling) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto dir = fixtures_dir() / "llama_f32";
  const nlohmann::json expected = read_json(dir / "expected.json");
  const auto prompt = expected["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  const Loaded whole = load_whole(dir);
  ASSERT_TRUE(whole.weights);
  const CudaTensorParallelOptions options = tp_options(16);
  auto tp1 = tp1_runner(whole, options);
  auto tp4 = tpn_runner(whole, 4, options);
  ASSERT_TRUE(tp1 && tp4);

  const int32_t n = static_cast<int32_t>(prompt.size());
  ForwardBatch first;
  first.token_ids = prompt;
  for (int32_t i = 0; i < n; ++i) first.positions.push_back(i);
  SequenceSlice a;
  a.num_new_tokens = n;
  a.block_table = {5, 1, 9};
  a.logits_for_last_token = true;
  first.sequences = {a};
  ForwardBatch second;
  second.token_ids = {prompt[1]};
  second.positions = {n};
  a.num_cached_tokens = n;
  a.num_new_tokens = 1;
  SequenceSlice b;
  b.token_offset = 1;
  b.num_new_tokens = n;
  b.block_table = {2, 12, 7};
  b.logits_for_all_new_tokens = true;
  second.token_ids.insert(second.token_ids.end(), other.begin(), other.end());
  for (int32_t i = 0; i < n; ++i) second.positions.push_back(i);
  second.sequences = {a, b};

  double worst = 0.0;
  for (const ForwardBatch* batch : {&first, &second}) {
    auto want = tp1->execute(*batch, {});
    auto got = tp4->execute(*batch, {});
    ASSERT_TRUE(want.ok() && got.ok()) << want.status().to_string() << " " << got.status().to_string();
    const size_t vocab = static_cast<size_t>(whole.config.vocab_size);
    ASSERT_EQ(got->host_logits.size(), static_cast<size_t>(batch->num_logit_rows()) * vocab);
    for (int32_t row = 0; row < batch->num_logit_rows(); ++row) {
      const std::vector<float> w(want->host_logits.begin() + row * vocab, want->host_logits.begin() + (row + 1) * vocab);
      const std::vector<float> g(got->host_logits.begin() + row * vocab, got->host_logits.begin() + (row + 1) * vocab);
      worst = std::max(worst, relative_difference(g, w));
    }
  }
  EXPECT_LT(worst, kRelativeBound);
  std::printf("two sequences, TP=4 (one GPU): max logit difference to TP=1 %.2e (relative)\n", worst);

  // The same step again on fresh runners, sampled on the device (temperature 0: argmax) on every row.
  auto tp4_sampled = tpn_runner(whole, 4, options);
  ASSERT_TRUE(tp4_sampled);
  ASSERT_TRUE(tp4_sampled->execute(first, {}).ok());
  std::vector<runtime::RowSampling> rows(static_cast<size_t>(second.num_logit_rows()));
  for (auto& row : rows) row.on_device = true;
  rows[3].on_device = false;  // one row's logits come back to the host
  auto sampled = tp4_sampled->execute(second, rows);
  ASSERT_TRUE(sampled.ok()) << sampled.status().to_string();
  ASSERT_EQ(sampled->tokens.size(), rows.size());
  auto logits = tp4->execute(second, {});  // tp4 already holds the same KV: the prompt blocks are rewritten alike
  ASSERT_TRUE(logits.ok());
  const size_t vocab = static_cast<size_t>(whole.config.vocab_size);
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].on_device) continue;
    const std::vector<float> row(logits->host_logits.begin() + r * vocab, logits->host_logits.begin() + (r + 1) * vocab);
    EXPECT_EQ(sampled->tokens[r], argmax(row)) << "row " << r;
  }
  ASSERT_EQ(sampled->host_logits.size(), vocab);
}

// An fp8 KV cache on every rank: TP=2 against TP=1 with the same fp8 KV.
TEST(CudaTensorParallelTest, Fp8KvCache) {
  PAGODA_SKIP_WITHOUT_GPU();
  const auto dir = fixtures_dir() / "llama3_rope_bf16";
  const nlohmann::json expected = read_json(dir / "expected.json");
  const auto prompt = expected["prompt_ids"].get<std::vector<int32_t>>();
  const auto greedy = expected["greedy_tokens"].get<std::vector<int32_t>>();
  const Loaded whole = load_whole(dir);
  ASSERT_TRUE(whole.weights);
  const CudaTensorParallelOptions options = tp_options(8, DType::kFP8E4M3);
  auto tp1 = tp1_runner(whole, options);
  auto tp2 = tpn_runner(whole, 2, options);
  ASSERT_TRUE(tp1 && tp2);
  EXPECT_EQ(tp2->kv_geometry().key_dtype, DType::kFP8E4M3);
  const std::vector<int32_t> feed(greedy.begin(), greedy.end() - 1);
  const auto reference = run_forced(*tp1, prompt, feed);
  const auto ours = run_forced(*tp2, prompt, feed);
  ASSERT_EQ(ours.size(), reference.size());
  double worst = 0.0;
  int32_t equal = 0;
  for (size_t step = 0; step < ours.size(); ++step) {
    worst = std::max(worst, relative_difference(ours[step], reference[step]));
    equal += argmax(ours[step]) == argmax(reference[step]);
  }
  EXPECT_LT(worst, kFp8RelativeBound);
  std::printf("llama3_rope_bf16 fp8 KV, TP=2 (one GPU): argmax equal to TP=1 at %d/%zu steps, max logit difference "
              "%.2e (relative)\n", equal, ours.size(), worst);
}

TEST(CudaTensorParallelTest, Errors) {
  PAGODA_SKIP_WITHOUT_GPU();
  const Loaded whole = load_whole(fixtures_dir() / "llama_f32");
  ASSERT_TRUE(whole.weights);
  auto three = CudaTensorParallelRunner::create(whole.config, whole.weights, 3, tp_options(8));
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().to_string().find("--tensor-parallel-size 3"), std::string::npos)
      << three.status().to_string();
  auto no_blocks = CudaTensorParallelRunner::create(whole.config, whole.weights, 2, tp_options(0));
  ASSERT_FALSE(no_blocks.ok());
  EXPECT_NE(no_blocks.status().to_string().find("num_blocks"), std::string::npos) << no_blocks.status().to_string();
  CudaTensorParallelOptions many = tp_options(8);
  many.same_device = false;
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  auto too_many = CudaTensorParallelRunner::create(whole.config, whole.weights, 4, many);
  if (count < 4) {
    ASSERT_FALSE(too_many.ok());
    EXPECT_NE(too_many.status().to_string().find("more ranks than the"), std::string::npos)
        << too_many.status().to_string();
  }
  // A batch the pool cannot hold fails on every rank alike, and the group goes on.
  auto tp2 = tpn_runner(whole, 2, tp_options(8));
  ASSERT_TRUE(tp2);
  ForwardBatch bad;
  bad.token_ids = {1, 2};
  bad.positions = {0, 1};
  SequenceSlice s;
  s.num_new_tokens = 2;
  s.block_table = {99};
  s.logits_for_last_token = true;
  bad.sequences = {s};
  EXPECT_FALSE(tp2->execute(bad, {}).ok());
  bad.sequences[0].block_table = {0};
  auto good = tp2->execute(bad, {});
  EXPECT_TRUE(good.ok()) << good.status().to_string();
}

}  // namespace
}  // namespace pagoda::cuda
