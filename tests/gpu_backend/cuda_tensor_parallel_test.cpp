// Tensor parallelism on the GPU (docs/TENSOR_PARALLEL.md), testable on ONE GPU:
// the same-device communicator (N ranks on one device, collectives in rank
// order) against host sums bit for bit, and the sharded CUDA forward at TP=2
// and TP=4 over it against TP=1 on the same GPU on the llama-family fixtures
// (bf16 weights and activations): logits within a measured bound of TP=1,
// greedy tokens equal wherever TP=1's top-1 margin is clear of that bound,
// a batch of two sequences (a decode beside a prompt), on-device sampling, an
// fp8 KV cache, bitwise-repeatable TP=N runs, and the errors. TP=N steps run
// eagerly unless PAGODA_TP_CUDA_GRAPHS=1 (experimental): then the decode steps
// run in CUDA graphs per rank, and two more tests run, graphs against eager
// steps at TP=2/4 with several sequences in a padded bucket; fp8 weights
// (--quantization fp8, each rank quantizing its slices) against TP=1 fp8;
// streaming token eviction compacting every rank's pool against TP=1's.

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

// CUDA graphs at TP>1 are experimental and opt-in (PAGODA_TP_CUDA_GRAPHS=1, cuda_tensor_parallel_runner.h): their
// first GPU run hung in CapturedCollectivesReplayPerRank. Without the switch the graph tests skip and every TP>1
// runner of this suite steps eagerly.
constexpr const char* kGraphsOptIn =
    "CUDA graphs at TP>1 are experimental (hung on the same-device communicator in their first GPU run): set "
    "PAGODA_TP_CUDA_GRAPHS=1 to run this test";

// With the switch, the same-device ranks' graphs meet through spinning kernels (same_device_communicator.h): every
// rank's stream gets a hardware queue of its own when CUDA starts with the most queues, and kernels load eagerly so
// that no lazy load waits for an idle device while a rank spins (set before main, so before CUDA starts).
const bool kGraphEnvironment = [] {
  if (!tensor_parallel_cuda_graphs_requested()) return false;
  return setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0) == 0 && setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}();

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

// Collectives inside CUDA graphs: every rank captures its own graph (a copy of fresh input, an all-reduce, an
// all-gather) at the same time, then replays it on its own stream round after round with new inputs; the ranks
// meet on device counters, and every round's sums and gathers equal the host's bit for bit.
TEST(SameDeviceCommunicatorTest, CapturedCollectivesReplayPerRank) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!tensor_parallel_cuda_graphs_requested()) GTEST_SKIP() << kGraphsOptIn;
  for (int32_t n : {2, 4}) {
    auto comms = make_same_device_communicators(n, 0);
    ASSERT_TRUE(comms.ok()) << comms.status().to_string();
    constexpr size_t kCount = 777;
    constexpr int kRounds = 20;
    std::vector<Status> status(static_cast<size_t>(n), ok_status());
    std::vector<int> mismatches(static_cast<size_t>(n), 0);
    auto input = [](int32_t rank, int round, size_t i) {
      return static_cast<float>((rank + 1) * 0.37 + round * 1.5 - static_cast<double>(i % 13) * 0.11);
    };
    // Every rank's graph is instantiated and uploaded before any rank replays: instantiation may wait for the
    // device, which a rank already spinning in its replay would never leave (docs/TENSOR_PARALLEL.md).
    std::barrier instantiated(n);
    on_threads(n, [&](int32_t r) {
      const size_t me = static_cast<size_t>(r);
      cudaSetDevice(0);
      DeviceBuffer src = to_device(std::vector<float>(kCount, 0.0f));
      DeviceBuffer data = to_device(std::vector<float>(kCount, 0.0f));
      DeviceBuffer gathered = to_device(std::vector<float>(kCount * static_cast<size_t>(n), 0.0f));
      wait_for_uploads();
      cudaStream_t stream = nullptr;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      Status& st = status[me];
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        st = internal_error("begin capture");
      cudaMemcpyAsync(data.data(), src.data(), kCount * sizeof(float), cudaMemcpyDeviceToDevice, stream);
      if (st.ok()) st = (*comms)[me]->enqueue_all_reduce_sum(data.data(), kCount, DType::kF32, stream);
      if (st.ok()) st = (*comms)[me]->enqueue_all_gather(data.data(), gathered.data(), kCount, DType::kF32, stream);
      const cudaError_t end = cudaStreamEndCapture(stream, &graph);
      if (st.ok() && end != cudaSuccess) st = internal_error("end capture: {}", cudaGetErrorString(end));
      if (st.ok() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) st = internal_error("instantiate");
      if (st.ok() && cudaGraphUpload(exec, stream) != cudaSuccess) st = internal_error("upload");
      if (st.ok() && cudaStreamSynchronize(stream) != cudaSuccess) st = internal_error("upload sync");
      instantiated.arrive_and_wait();
      for (int round = 0; round < kRounds && st.ok(); ++round) {
        std::vector<float> mine(kCount);
        for (size_t i = 0; i < kCount; ++i) mine[i] = input(r, round, i);
        cudaMemcpyAsync(src.data(), mine.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, stream);
        if (cudaGraphLaunch(exec, stream) != cudaSuccess) st = internal_error("launch");
        if (cudaStreamSynchronize(stream) != cudaSuccess) st = internal_error("replay");
        const auto sums = to_host<float>(data, kCount);
        const auto all = to_host<float>(gathered, kCount * static_cast<size_t>(n));
        for (size_t i = 0; i < kCount; ++i) {
          float want = 0.0f;
          for (int32_t k = 0; k < n; ++k) want += input(k, round, i);
          mismatches[me] += std::memcmp(&sums[i], &want, sizeof(float)) != 0;
          for (int32_t k = 0; k < n; ++k) mismatches[me] += all[static_cast<size_t>(k) * kCount + i] != want;
        }
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    });
    for (int32_t r = 0; r < n; ++r) {
      EXPECT_TRUE(status[static_cast<size_t>(r)].ok()) << status[static_cast<size_t>(r)].to_string() << " rank " << r;
      EXPECT_EQ(mismatches[static_cast<size_t>(r)], 0) << "rank " << r << " of " << n;
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

// TP=N decode steps run eagerly unless PAGODA_TP_CUDA_GRAPHS=1 (the runner itself decides: set_use_cuda_graphs).
bool tp_eager() { return !tensor_parallel_cuda_graphs_requested(); }

std::unique_ptr<CudaTensorParallelRunner> tpn_runner(const Loaded& m, int32_t size,
                                                     const CudaTensorParallelOptions& o) {
  auto runner = CudaTensorParallelRunner::create(m.config, m.weights, size, o);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return nullptr;
  return std::move(*runner);
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

// Several sequences decoding together (a padded graph bucket): the prompts in
// one step, then `steps` decode steps of fixed tokens; every step's logits.
std::vector<std::vector<float>> run_decode_batch(runtime::ModelRunner& runner,
                                                 const std::vector<std::vector<int32_t>>& prompts, int32_t steps) {
  const int32_t vocab = runner.vocab_size();
  const int32_t per_seq = runner.kv_geometry().num_blocks / static_cast<int32_t>(prompts.size());
  ForwardBatch batch;
  std::vector<int32_t> context;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceSlice seq;
    seq.token_offset = static_cast<int32_t>(batch.token_ids.size());
    seq.num_new_tokens = static_cast<int32_t>(prompts[i].size());
    seq.logits_for_last_token = true;
    for (int32_t b = per_seq - 1; b >= 0; --b) seq.block_table.push_back(static_cast<int32_t>(i) * per_seq + b);
    for (size_t t = 0; t < prompts[i].size(); ++t) {
      batch.token_ids.push_back(prompts[i][t]);
      batch.positions.push_back(static_cast<int32_t>(t));
    }
    batch.sequences.push_back(seq);
    context.push_back(seq.num_new_tokens);
  }
  std::vector<std::vector<float>> out;
  for (int32_t step = 0; step <= steps; ++step) {
    auto result = runner.execute(batch, {});
    EXPECT_TRUE(result.ok()) << result.status().to_string();
    if (!result.ok()) break;
    out.push_back(result->host_logits);
    batch.token_ids.clear();
    batch.positions.clear();
    for (size_t i = 0; i < prompts.size(); ++i) {
      SequenceSlice& seq = batch.sequences[i];
      seq.token_offset = static_cast<int32_t>(i);
      seq.num_cached_tokens = context[i];
      seq.num_new_tokens = 1;
      batch.token_ids.push_back((prompts[i][0] + 7 * step + static_cast<int32_t>(i)) % vocab);
      batch.positions.push_back(context[i]);
      ++context[i];
    }
  }
  return out;
}

// CUDA graphs at TP>1: every rank captures its decode step (the collectives inside: here the same-device
// communicator's device-side rendezvous) and replays it; the replays give the eager steps' logits.
TEST(CudaTensorParallelTest, CudaGraphsEqualEagerSteps) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!tensor_parallel_cuda_graphs_requested()) GTEST_SKIP() << kGraphsOptIn;
  for (const char* name : {"llama_f32", "qwen2_tied_bf16"}) {
    const auto dir = fixtures_dir() / name;
    const nlohmann::json expected = read_json(dir / "expected.json");
    const auto prompt = expected["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<std::vector<int32_t>> prompts = {prompt, std::vector<int32_t>(prompt.rbegin(), prompt.rend()),
                                                 std::vector<int32_t>(prompt.begin() + 1, prompt.end())};
    const Loaded whole = load_whole(dir);
    ASSERT_TRUE(whole.weights);
    constexpr int32_t kSteps = 6;
    const CudaTensorParallelOptions options = tp_options(12);
    auto tp1 = tp1_runner(whole, options);
    ASSERT_TRUE(tp1);
    const auto reference = run_decode_batch(*tp1, prompts, kSteps);
    for (int32_t size : {2, 4}) {
      auto graphs = tpn_runner(whole, size, options);
      auto eager = tpn_runner(whole, size, options);
      ASSERT_TRUE(graphs && eager);
      eager->set_use_cuda_graphs(false);
      const auto replayed = run_decode_batch(*graphs, prompts, kSteps);
      const auto stepped = run_decode_batch(*eager, prompts, kSteps);
      ASSERT_EQ(replayed.size(), reference.size());
      ASSERT_EQ(stepped.size(), reference.size());
      // Three sequences run in the bucket of 4: the first decode step captures, later ones replay, every rank alike.
      EXPECT_GT(graphs->rank(0).model().graph_replays(), 0) << name << " TP=" << size;
      for (int32_t r = 0; r < size; ++r) {
        EXPECT_EQ(graphs->rank(r).model().graphs_captured(), 1) << name << " TP=" << size << " rank " << r;
        EXPECT_EQ(graphs->rank(r).model().graph_replays(), graphs->rank(0).model().graph_replays()) << "rank " << r;
        EXPECT_EQ(eager->rank(r).model().graph_replays(), 0);
      }
      const size_t vocab = static_cast<size_t>(whole.config.vocab_size);
      double graph_vs_eager = 0.0, graph_vs_tp1 = 0.0;
      int32_t equal = 0, rows = 0;
      for (size_t step = 0; step < reference.size(); ++step) {
        ASSERT_EQ(replayed[step].size(), prompts.size() * vocab);
        for (size_t i = 0; i < prompts.size(); ++i) {
          auto row = [&](const std::vector<float>& all) {
            return std::vector<float>(all.begin() + i * vocab, all.begin() + (i + 1) * vocab);
          };
          const auto g = row(replayed[step]), e = row(stepped[step]), w = row(reference[step]);
          graph_vs_eager = std::max(graph_vs_eager, relative_difference(g, e));
          graph_vs_tp1 = std::max(graph_vs_tp1, relative_difference(g, w));
          ++rows;
          equal += argmax(g) == argmax(e);
          double scale = 1.0;
          for (float x : e) scale = std::max(scale, static_cast<double>(std::abs(x)));
          if (top1_margin(e) > 2.0 * kRelativeBound * scale) {
            EXPECT_EQ(argmax(g), argmax(e)) << name << " TP=" << size << " step " << step << " sequence " << i;
          }
        }
      }
      EXPECT_LT(graph_vs_eager, kRelativeBound) << name << " TP=" << size;
      EXPECT_LT(graph_vs_tp1, kRelativeBound) << name << " TP=" << size;
      std::printf("%s TP=%d (one GPU), 3 sequences x %d decode steps in CUDA graphs: argmax equal to the eager "
                  "steps' at %d/%d rows, max logit difference to eager %.2e, to TP=1 %.2e (relative)\n",
                  name, size, kSteps, equal, rows, graph_vs_eager, graph_vs_tp1);
      // A second graph runner repeats the first bit for bit (the rank-order sums hold inside the graphs).
      auto again = tpn_runner(whole, size, options);
      ASSERT_TRUE(again);
      const auto repeat = run_decode_batch(*again, prompts, kSteps);
      ASSERT_EQ(repeat.size(), replayed.size());
      for (size_t step = 0; step < repeat.size(); ++step)
        EXPECT_EQ(std::memcmp(repeat[step].data(), replayed[step].data(), repeat[step].size() * sizeof(float)), 0)
            << name << " TP=" << size << " step " << step << " is not reproducible";
    }
  }
}

// fp8 weights (--quantization fp8) at TP=2/4: each rank quantizes its own slices (the column-parallel rows keep
// TP=1's per-channel scales, the row-parallel rows get one scale over the rank's columns), against TP=1 fp8.
TEST(CudaTensorParallelTest, Fp8WeightsAgainstTp1Fp8) {
  PAGODA_SKIP_WITHOUT_GPU();
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  const auto dir = std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "models/pagoda-tiny";
  const Loaded whole = load_whole(dir);
  ASSERT_TRUE(whole.weights);
  CudaTensorParallelOptions bf16_options = tp_options(8);
  CudaTensorParallelOptions options = bf16_options;
  options.model.fp8_weights = true;
  auto tp1_bf16 = tp1_runner(whole, bf16_options);
  auto tp1 = tp1_runner(whole, options);
  ASSERT_TRUE(tp1 && tp1_bf16);
  const int32_t vocab = whole.config.vocab_size;
  std::vector<int32_t> prompt(21);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
  std::vector<int32_t> feed(10);
  for (size_t i = 0; i < feed.size(); ++i) feed[i] = static_cast<int32_t>((i * 101 + 5) % vocab);
  const auto reference = run_forced(*tp1, prompt, feed);
  const auto unquantized = run_forced(*tp1_bf16, prompt, feed);
  ASSERT_EQ(reference.size(), feed.size() + 1);
  double fp8_vs_bf16 = 0.0;
  for (size_t step = 0; step < reference.size(); ++step)
    fp8_vs_bf16 = std::max(fp8_vs_bf16, relative_difference(reference[step], unquantized[step]));
  constexpr double kFp8WeightsBound = 0.1;
  for (int32_t size : {2, 4}) {
    auto tpn = tpn_runner(whole, size, options);
    ASSERT_TRUE(tpn);
    for (int32_t r = 0; r < size; ++r)
      EXPECT_EQ(tpn->rank(r).model().fp8_projections(), 4 * whole.config.num_layers) << "rank " << r;
    const auto ours = run_forced(*tpn, prompt, feed);
    ASSERT_EQ(ours.size(), reference.size());
    double worst = 0.0;
    int32_t equal = 0, clear = 0;
    for (size_t step = 0; step < ours.size(); ++step) {
      worst = std::max(worst, relative_difference(ours[step], reference[step]));
      equal += argmax(ours[step]) == argmax(reference[step]);
      double scale = 1.0;
      for (float x : reference[step]) scale = std::max(scale, static_cast<double>(std::abs(x)));
      if (top1_margin(reference[step]) > 2.0 * kFp8WeightsBound * scale) {
        ++clear;
        EXPECT_EQ(argmax(ours[step]), argmax(reference[step])) << "TP=" << size << " step " << step;
      }
    }
    EXPECT_LT(worst, kFp8WeightsBound) << "TP=" << size;
    if (!tp_eager()) {
      EXPECT_GT(tpn->rank(0).model().graph_replays(), 0);
    }
    std::printf("pagoda-tiny fp8 weights, TP=%d (one GPU): argmax equal to TP=1 fp8 at %d/%zu steps (%d with a clear "
                "margin), max logit difference to TP=1 fp8 %.2e (relative; TP=1 fp8 vs bf16: %.2e)\n",
                size, equal, ours.size(), clear, worst, fp8_vs_bf16);
  }
}

// fp8 checkpoints at TP=2: each rank uploads its slices with their scales (per-tensor / per-channel weight scales,
// static or dynamic activations), against TP=1 on the same checkpoint. (TP=4 would give down_proj 40 input
// columns per rank, below the fp8 GEMM's multiples of 16: real models' widths are multiples of 128.)
TEST(CudaTensorParallelTest, Fp8CheckpointsAgainstTp1) {
  PAGODA_SKIP_WITHOUT_GPU();
  const char* env = std::getenv("PAGODA_SOURCE_DIR");
  const auto fp8_dir = std::filesystem::path(env != nullptr ? env : PAGODA_SOURCE_DIR) / "tests/fixtures/fp8";
  constexpr double kBound = 0.1;
  for (const char* name : {"ct_channel_dynamic", "ct_tensor_static", "modelopt_fp8"}) {
    const auto dir = fp8_dir / name;
    const auto prompt = read_json(dir / "expected.json")["prompt_ids"].get<std::vector<int32_t>>();
    const Loaded whole = load_whole(dir);
    ASSERT_TRUE(whole.weights && whole.weights->fp8) << name;
    const CudaTensorParallelOptions options = tp_options(8);
    auto tp1 = tp1_runner(whole, options);
    auto tp2 = tpn_runner(whole, 2, options);
    ASSERT_TRUE(tp1 && tp2) << name;
    std::vector<int32_t> feed(10);
    for (size_t i = 0; i < feed.size(); ++i) feed[i] = static_cast<int32_t>((i * 29 + 3) % whole.config.vocab_size);
    const auto reference = run_forced(*tp1, prompt, feed);
    const auto ours = run_forced(*tp2, prompt, feed);
    ASSERT_EQ(ours.size(), reference.size());
    EXPECT_EQ(tp2->rank(0).model().fp8_projections(), tp2->rank(1).model().fp8_projections());
    EXPECT_GT(tp2->rank(0).model().fp8_projections(), 0) << name;
    double worst = 0.0;
    int32_t equal = 0;
    for (size_t step = 0; step < ours.size(); ++step) {
      worst = std::max(worst, relative_difference(ours[step], reference[step]));
      equal += argmax(ours[step]) == argmax(reference[step]);
      double scale = 1.0;
      for (float x : reference[step]) scale = std::max(scale, static_cast<double>(std::abs(x)));
      if (top1_margin(reference[step]) > 2.0 * kBound * scale) {
        EXPECT_EQ(argmax(ours[step]), argmax(reference[step])) << name << " step " << step;
      }
    }
    EXPECT_LT(worst, kBound) << name;
    std::printf("fp8 checkpoint %s TP=2 (one GPU): %d fp8 projections per rank, argmax equal to TP=1 at %d/%zu steps, "
                "max logit difference %.2e (relative)\n", name, tp2->rank(0).model().fp8_projections(), equal,
                ours.size(), worst);
  }
}

// Streaming eviction at TP=2 (KV heads split) and TP=4 (replicated): a 120-token prompt, compacted to 40 tokens
// (4 sinks + the last 8 + ... as streaming keeps them) on every rank, then decode steps on the compacted cache:
// the logits follow TP=1's through the same compaction. Scored policies are refused by name.
TEST(CudaTensorParallelTest, StreamingEvictionOnEveryRank) {
  PAGODA_SKIP_WITHOUT_GPU();
  const Loaded whole = load_whole(fixtures_dir() / "llama_f32");
  ASSERT_TRUE(whole.weights);
  const int32_t vocab = whole.config.vocab_size;
  const CudaTensorParallelOptions options = tp_options(24);
  runtime::KvCompaction job;
  job.kv_state = 5;
  job.config.policy = runtime::KvCompressionPolicy::kStreaming;
  job.config.budget = 40;
  job.config.sink_tokens = 4;
  job.config.window = 8;
  job.old_block_table = {9, 1, 4, 12, 6, 3, 20, 17};  // 8 blocks of 16: 120 tokens
  job.old_length = 120;
  job.new_block_table = {0, 2, 5};
  job.new_length = 40;
  // Prompt, compaction, then 6 decode steps of fixed tokens at their true positions on the compacted cache.
  auto run = [&](runtime::ModelRunner& runner) {
    std::vector<std::vector<float>> out;
    ForwardBatch batch;
    for (int32_t i = 0; i < job.old_length; ++i) {
      batch.token_ids.push_back((i * 37 + 7) % vocab);
      batch.positions.push_back(i);
    }
    SequenceSlice seq;
    seq.num_new_tokens = job.old_length;
    seq.block_table = job.old_block_table;
    seq.logits_for_last_token = true;
    batch.sequences = {seq};
    auto prompt = runner.execute(batch, {});
    EXPECT_TRUE(prompt.ok()) << prompt.status().to_string();
    if (!prompt.ok()) return out;
    out.push_back(prompt->host_logits);
    const Status compacted = runner.compact_kv(job);
    EXPECT_TRUE(compacted.ok()) << compacted.to_string();
    if (!compacted.ok()) return out;
    batch.sequences[0].block_table = job.new_block_table;
    batch.sequences[0].block_table.push_back(7);
    for (int32_t step = 0; step < 6; ++step) {
      batch.token_ids = {(step * 53 + 3) % vocab};
      batch.positions = {job.old_length + step};
      batch.sequences[0].num_cached_tokens = job.new_length + step;
      batch.sequences[0].num_new_tokens = 1;
      auto decoded = runner.execute(batch, {});
      EXPECT_TRUE(decoded.ok()) << decoded.status().to_string();
      if (!decoded.ok()) break;
      out.push_back(decoded->host_logits);
    }
    return out;
  };
  auto tp1 = tp1_runner(whole, options);
  ASSERT_TRUE(tp1);
  ASSERT_TRUE(tp1->capabilities().compacts_kv);
  const auto reference = run(*tp1);
  ASSERT_EQ(reference.size(), 7u);
  for (int32_t size : {2, 4}) {
    auto tpn = tpn_runner(whole, size, options);
    ASSERT_TRUE(tpn);
    EXPECT_TRUE(tpn->capabilities().compacts_kv);
    EXPECT_FALSE(tpn->capabilities().kv_attention_scores);
    const auto ours = run(*tpn);
    ASSERT_EQ(ours.size(), reference.size());
    double worst = 0.0;
    int32_t equal = 0;
    for (size_t step = 0; step < ours.size(); ++step) {
      worst = std::max(worst, relative_difference(ours[step], reference[step]));
      equal += argmax(ours[step]) == argmax(reference[step]);
      double scale = 1.0;
      for (float x : reference[step]) scale = std::max(scale, static_cast<double>(std::abs(x)));
      if (top1_margin(reference[step]) > 2.0 * kRelativeBound * scale) {
        EXPECT_EQ(argmax(ours[step]), argmax(reference[step])) << "TP=" << size << " step " << step;
      }
    }
    EXPECT_LT(worst, kRelativeBound) << "TP=" << size;
    std::printf("llama_f32 TP=%d (one GPU), streaming eviction 120 -> 40 tokens then 6 decode steps: argmax equal to "
                "TP=1 at %d/%zu steps, max logit difference %.2e (relative)\n", size, equal, ours.size(), worst);
    runtime::KvCompaction scored = job;
    scored.config.policy = runtime::KvCompressionPolicy::kH2O;
    const Status refused = tpn->compact_kv(scored);
    EXPECT_EQ(refused.code(), StatusCode::kUnimplemented);
    EXPECT_NE(refused.to_string().find("--tensor-parallel-size"), std::string::npos) << refused.to_string();
    tpn->release_kv_state(job.kv_state);
  }
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
