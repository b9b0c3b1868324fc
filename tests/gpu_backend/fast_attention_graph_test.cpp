// backend/cuda/attention's fast attention inside the whole-model GPU forward (label gpu):
//  - graph mode: launches captured once in a CUDA graph, replayed after each
//    step's plan_graph(), give the same bits as eager fast attention over many
//    steps with changing batch sizes, lengths and scattered block tables, and
//    padding rows come out zero;
//  - the drift question: on one random bf16 checkpoint (head_dim 128, so the
//    Hopper kernels run) loaded by both CpuModel (f32) and CudaModel, the
//    logit error of the GPU with fast attention and with the builtin kernel,
//    each against the CPU reference, at depths 1 to 32 layers; and greedy
//    decoding with fast attention inside the decode graphs against the CPU.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/backend/cpu/cpu_model.h"

namespace pagoda::cuda {
namespace {

using testing::append_sequence;
using testing::relative_max_error;
using testing::from_bf16_bits;
using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;

// ---------------------------------------------------------------------------
// Graph replay vs eager, attention only.

struct AttentionShape {
  int32_t q_heads, kv_heads, head_dim;
};

// Double-precision attention of one decode row against the host copy of the pool.
std::vector<double> reference_row(const std::vector<float>& q_row, const std::vector<float>& k_pool,
                                  const std::vector<float>& v_pool, const std::vector<int32_t>& table, int32_t length,
                                  const AttentionShape& s, int32_t block_size) {
  const int32_t group = s.q_heads / s.kv_heads;
  const int64_t token_stride = int64_t{s.kv_heads} * s.head_dim;
  std::vector<double> out(static_cast<size_t>(s.q_heads) * s.head_dim, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  for (int32_t h = 0; h < s.q_heads; ++h) {
    const int32_t kvh = h / group;
    std::vector<double> scores(static_cast<size_t>(length));
    double m = -1e300;
    for (int32_t p = 0; p < length; ++p) {
      const int64_t base = (int64_t{table[static_cast<size_t>(p / block_size)]} * block_size + p % block_size) *
                               token_stride + int64_t{kvh} * s.head_dim;
      double dot = 0;
      for (int32_t d = 0; d < s.head_dim; ++d)
        dot += double{q_row[static_cast<size_t>(h * s.head_dim + d)]} * k_pool[static_cast<size_t>(base + d)];
      scores[static_cast<size_t>(p)] = dot * scale;
      m = std::max(m, dot * scale);
    }
    double sum = 0;
    for (double& x : scores) sum += (x = std::exp(x - m));
    for (int32_t p = 0; p < length; ++p) {
      const int64_t base = (int64_t{table[static_cast<size_t>(p / block_size)]} * block_size + p % block_size) *
                               token_stride + int64_t{kvh} * s.head_dim;
      for (int32_t d = 0; d < s.head_dim; ++d)
        out[static_cast<size_t>(h * s.head_dim + d)] +=
            scores[static_cast<size_t>(p)] / sum * v_pool[static_cast<size_t>(base + d)];
    }
  }
  return out;
}

class GraphReplay : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(GraphReplay, EqualsEagerFastAttentionBitForBitOverManySteps) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  const AttentionShape s = GetParam();
  const int32_t block_size = 16, num_blocks = 600, stride = 64;  // up to 1,024 positions per sequence
  const int32_t bucket = 8, max_bucket = 16, layers = 2;
  ModelConfig config;
  config.num_q_heads = s.q_heads;
  config.num_kv_heads = s.kv_heads;
  config.head_dim = s.head_dim;
  const size_t pool_elems = static_cast<size_t>(num_blocks) * block_size * s.kv_heads * s.head_dim;
  const size_t q_elems = static_cast<size_t>(bucket) * s.q_heads * s.head_dim;

  // Two layers' pools of random bf16, K in [-2, 2), V in [-1, 1).
  std::vector<std::vector<float>> k_host, v_host;
  std::vector<DeviceBuffer> k_dev, v_dev;
  for (int32_t l = 0; l < layers; ++l) {
    k_host.push_back(random_bf16_values(pool_elems, -2.0f, 2.0f, 100 + l));
    v_host.push_back(random_bf16_values(pool_elems, -1.0f, 1.0f, 200 + l));
    k_dev.push_back(to_device(to_bf16_bits(k_host.back())));
    v_dev.push_back(to_device(to_bf16_bits(v_host.back())));
  }
  auto layer = [&](int32_t l) {
    DevicePagedKvLayer kv;
    kv.key = k_dev[static_cast<size_t>(l)].as<bf16>();
    kv.value = v_dev[static_cast<size_t>(l)].as<bf16>();
    kv.num_blocks = num_blocks;
    kv.block_size = block_size;
    kv.num_kv_heads = s.kv_heads;
    kv.head_dim = s.head_dim;
    return kv;
  };
  DeviceBuffer q = to_device(std::vector<uint16_t>(q_elems, 0));
  std::vector<DeviceBuffer> out_graph, out_eager;
  for (int32_t l = 0; l < layers; ++l) {
    out_graph.push_back(to_device(std::vector<uint16_t>(q_elems, 0x7fc0)));  // NaN until written
    out_eager.push_back(to_device(std::vector<uint16_t>(q_elems, 0x7fc0)));
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  FastAttention graph_fast, eager_fast;
  cudaGraphExec_t exec = nullptr;
  std::mt19937 rng(1234 + s.head_dim);
  std::vector<int32_t> all_blocks(static_cast<size_t>(num_blocks));
  std::iota(all_blocks.begin(), all_blocks.end(), 0);
  int64_t compared_rows = 0;
  double worst_rel = 0;

  for (int step = 0; step < 24; ++step) {
    // 1..bucket sequences, lengths 1..1,024 (odd ones, block edges), scattered tables.
    const int32_t n = 1 + static_cast<int32_t>(rng() % bucket);
    std::shuffle(all_blocks.begin(), all_blocks.end(), rng);
    ForwardBatch batch;
    size_t next_block = 0;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t choice = static_cast<int32_t>(rng() % 4);
      const int32_t length = choice == 0 ? 1 + static_cast<int32_t>(rng() % 40)
                                         : (choice == 1 ? 16 * (1 + static_cast<int32_t>(rng() % 64))
                                                        : 1 + static_cast<int32_t>(rng() % 1024));
      SequenceSlice slice;
      slice.token_offset = i;
      slice.num_new_tokens = 1;
      slice.num_cached_tokens = length - 1;
      for (int32_t b = 0; b < (length + block_size - 1) / block_size; ++b)
        slice.block_table.push_back(all_blocks[next_block++]);
      batch.token_ids.push_back(0);
      batch.positions.push_back(length - 1);
      batch.sequences.push_back(std::move(slice));
    }
    const std::vector<float> q_host = random_bf16_values(q_elems, -2.0f, 2.0f, 300 + step);
    ASSERT_EQ(cudaMemcpy(q.data(), to_bf16_bits(q_host).data(), q_elems * 2, cudaMemcpyHostToDevice), cudaSuccess);

    auto planned = graph_fast.plan_graph(config, batch, bucket, max_bucket, stride, block_size, num_blocks, stream);
    ASSERT_TRUE(planned.ok()) << planned.status().to_string();
    ASSERT_TRUE(*planned);
    if (exec == nullptr) {  // capture once, at the first step
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      for (int32_t l = 0; l < layers; ++l) {
        const Status run = graph_fast.run(layer(l), q.as<bf16>(), out_graph[static_cast<size_t>(l)].as<bf16>(), stream);
        ASSERT_TRUE(run.ok()) << run.to_string();
      }
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    for (auto& o : out_graph) ASSERT_EQ(cudaMemsetAsync(o.data(), 0xff, q_elems * 2, stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);

    auto eager_planned = eager_fast.plan(config, batch, block_size, num_blocks, stream);
    ASSERT_TRUE(eager_planned.ok() && *eager_planned);
    for (int32_t l = 0; l < layers; ++l) {
      const Status run = eager_fast.run(layer(l), q.as<bf16>(), out_eager[static_cast<size_t>(l)].as<bf16>(), stream);
      ASSERT_TRUE(run.ok()) << run.to_string();
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

    const size_t row = static_cast<size_t>(s.q_heads) * s.head_dim;
    for (int32_t l = 0; l < layers; ++l) {
      const std::vector<uint16_t> g = to_host<uint16_t>(out_graph[static_cast<size_t>(l)], q_elems);
      const std::vector<uint16_t> e = to_host<uint16_t>(out_eager[static_cast<size_t>(l)], q_elems);
      ASSERT_EQ(std::memcmp(g.data(), e.data(), static_cast<size_t>(n) * row * 2), 0)
          << "step " << step << " layer " << l << ": graph replay differs from eager fast attention";
      for (size_t i = static_cast<size_t>(n) * row; i < q_elems; ++i)
        ASSERT_EQ(g[i], 0) << "padding row " << i / row << " not zero at step " << step;
      // And both are right: every row against float64.
      const std::vector<float> got = from_bf16_bits(g);
      for (int32_t i = 0; i < n; ++i) {
        const SequenceSlice& slice = batch.sequences[static_cast<size_t>(i)];
        const std::vector<float> q_row(q_host.begin() + static_cast<int64_t>(i * row),
                                       q_host.begin() + static_cast<int64_t>((i + 1) * row));
        const std::vector<double> want =
            reference_row(q_row, k_host[static_cast<size_t>(l)], v_host[static_cast<size_t>(l)], slice.block_table,
                          slice.num_cached_tokens + 1, s, block_size);
        double err = 0, norm = 0;
        for (size_t j = 0; j < row; ++j) {
          err += (got[i * row + j] - want[j]) * (got[i * row + j] - want[j]);
          norm += want[j] * want[j];
        }
        const double rel = std::sqrt(err / std::max(norm, 1e-30));
        worst_rel = std::max(worst_rel, rel);
        EXPECT_LT(rel, 1e-2) << "step " << step << " sequence " << i << " length " << slice.num_cached_tokens + 1;
        ++compared_rows;
      }
    }
  }
  std::cout << "[ figure ] graph-mode decode, q/kv heads " << s.q_heads << "/" << s.kv_heads << " d=" << s.head_dim
            << ": " << compared_rows << " rows bit-identical to eager, worst relative L2 vs float64 " << worst_rel
            << "\n";
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GraphReplay,
                         ::testing::Values(AttentionShape{32, 8, 128}, AttentionShape{8, 1, 64},
                                           AttentionShape{6, 6, 256}),
                         [](const auto& info) {
                           return "q" + std::to_string(info.param.q_heads) + "_kv" +
                                  std::to_string(info.param.kv_heads) + "_d" + std::to_string(info.param.head_dim);
                         });

// ---------------------------------------------------------------------------
// The whole model: a random bf16 checkpoint on CPU (f32 reference) and GPU.

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 96;
constexpr int32_t kVocab = 512;

// Writes config.json + model.safetensors (bf16, Llama names) with weights
// uniform with std 0.02 (transformers' initializer_range, as --load-format
// random) and norms 1, into dir; num_layers layers.
void write_random_checkpoint(const std::filesystem::path& dir, int32_t num_layers, uint32_t seed) {
  std::filesystem::create_directories(dir);
  const int32_t hidden = 256, heads = 4, kv_heads = 2, head_dim = 128, inter = 512;
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", kVocab},
                           {"hidden_size", hidden}, {"intermediate_size", inter},
                           {"num_hidden_layers", num_layers}, {"num_attention_heads", heads},
                           {"num_key_value_heads", kv_heads}, {"head_dim", head_dim},
                           {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0},
                           {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}};
  std::ofstream(dir / "config.json") << config.dump(2);

  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Tensor> tensors = {{"model.embed_tokens.weight", {kVocab, hidden}}, {"model.norm.weight", {hidden}},
                                 {"lm_head.weight", {kVocab, hidden}}};
  for (int32_t l = 0; l < num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {hidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {hidden}});
    tensors.push_back({p + "self_attn.q_proj.weight", {heads * head_dim, hidden}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden}});
    tensors.push_back({p + "self_attn.o_proj.weight", {hidden, heads * head_dim}});
    tensors.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.02f * 1.7320508f, 0.02f * 1.7320508f);
  nlohmann::json header = nlohmann::json::object();
  std::vector<uint16_t> data;
  for (const Tensor& t : tensors) {
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    const size_t begin = data.size() * 2;
    const bool is_norm = t.shape.size() == 1;
    for (int64_t i = 0; i < count; ++i) data.push_back(f32_to_bf16(is_norm ? 1.0f : uniform(rng)));
    header[t.name] = {{"dtype", "BF16"}, {"shape", t.shape}, {"data_offsets", {begin, data.size() * 2}}};
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 2));
}

std::filesystem::path checkpoint_dir(int32_t num_layers) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("pagoda_fast_attention_" + std::to_string(::getpid()) + "_" + std::to_string(num_layers));
  if (!std::filesystem::exists(dir / "model.safetensors")) write_random_checkpoint(dir, num_layers, 77);
  return dir;
}

CudaModelOptions model_options(bool fast, DType kv_dtype = DType::kBF16) {
  CudaModelOptions o;
  o.kv_key_dtype = o.kv_value_dtype = kv_dtype;
  o.max_num_tokens = 512;
  o.max_num_seqs = 8;
  o.max_model_len = 512;
  o.block_size = kBlockSize;
  o.use_cuda_graphs = true;
  o.fast_attention = fast;
  o.show_progress = false;
  return o;
}

std::vector<int32_t> blocks(int32_t first, int32_t count) {
  std::vector<int32_t> b(static_cast<size_t>(count));
  std::iota(b.begin(), b.end(), first);
  return b;
}


struct Models {
  std::unique_ptr<CpuModel> cpu;
  std::unique_ptr<CpuKvPool> cpu_pool;
  std::unique_ptr<CudaModel> fast, builtin;
  std::unique_ptr<CudaKvPool> fast_pool, builtin_pool;
};

// CPU (f32 KV, or the same quantized KV format), GPU with fast and with builtin attention.
Models load_models(int32_t num_layers, DType kv_dtype = DType::kBF16) {
  Models m;
  const auto dir = checkpoint_dir(num_layers);
  auto cpu = CpuModel::load(dir);
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  m.cpu = std::move(cpu).value();
  const DType cpu_kv = kv_dtype == DType::kBF16 ? DType::kF32 : kv_dtype;
  auto cpu_pool = CpuKvPool::create(m.cpu->kv_pool_shape(kNumBlocks, kBlockSize, cpu_kv, cpu_kv));
  EXPECT_TRUE(cpu_pool.ok()) << cpu_pool.status().to_string();
  m.cpu_pool = std::make_unique<CpuKvPool>(std::move(cpu_pool).value());
  auto fast = CudaModel::load(dir, model_options(true, kv_dtype));
  auto builtin = CudaModel::load(dir, model_options(false, kv_dtype));
  EXPECT_TRUE(fast.ok() && builtin.ok());
  m.fast = std::move(fast).value();
  m.builtin = std::move(builtin).value();
  auto fp = CudaKvPool::create(m.fast->kv_pool_shape(kNumBlocks));
  auto bp = CudaKvPool::create(m.builtin->kv_pool_shape(kNumBlocks));
  EXPECT_TRUE(fp.ok() && bp.ok());
  m.fast_pool = std::move(fp).value();
  m.builtin_pool = std::move(bp).value();
  return m;
}

struct StepErrors {
  double fast = 0, builtin = 0, fast_vs_builtin = 0;
};

StepErrors run_step(Models& m, const ForwardBatch& batch, std::vector<float>* cpu_logits = nullptr) {
  std::vector<float> lc, lf, lb;
  const Status sc = m.cpu->forward(batch, *m.cpu_pool, lc);
  const Status sf = m.fast->forward(batch, *m.fast_pool, lf);
  const Status sb = m.builtin->forward(batch, *m.builtin_pool, lb);
  EXPECT_TRUE(sc.ok()) << sc.to_string();
  EXPECT_TRUE(sf.ok()) << sf.to_string();
  EXPECT_TRUE(sb.ok()) << sb.to_string();
  if (cpu_logits != nullptr) *cpu_logits = lc;
  return {relative_max_error(lf, lc), relative_max_error(lb, lc), relative_max_error(lf, lb)};
}

// The start-up check of the benchmark (two prompts of 200 and 77 tokens, all
// logits) at growing depth: fast and builtin attention against the f32 CPU.
TEST(FastAttentionDrift, FastIsAsCloseToTheCpuReferenceAsBuiltinAtEveryDepth) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::vector<int32_t> a(200), b(77);
  for (int32_t& t : a) t = token(rng);
  for (int32_t& t : b) t = token(rng);
  for (int32_t layers : {1, 2, 4, 8, 16, 32}) {
    Models m = load_models(layers);
    ASSERT_TRUE(m.cpu && m.fast && m.builtin);
    ForwardBatch prefill;
    append_sequence(prefill, a, 0, blocks(0, 13), true);
    append_sequence(prefill, b, 0, blocks(13, 8), true);
    const StepErrors e = run_step(m, prefill);
    std::cout << "[ figure ] drift, " << layers << " layers, prefill 200+77 (wgmma prefill): max|gpu - cpu| / max|cpu|"
              << " fast " << e.fast << ", builtin " << e.builtin << "; fast vs builtin " << e.fast_vs_builtin << "\n";
    EXPECT_EQ(m.fast->fast_attention_steps(), 1);
    // Both run the same bf16 GEMMs; attention is one op among many, so fast
    // must not be meaningfully farther from the f32 reference than builtin.
    EXPECT_LE(e.fast, 1.5 * e.builtin + 0.005) << layers << " layers";
    // Decode steps, every one through the graphs (bucket 2) with fast attention.
    double worst_fast = 0, worst_builtin = 0;
    std::vector<int32_t> next = {token(rng), token(rng)};
    for (int32_t step = 0; step < 6; ++step) {
      ForwardBatch decode;
      append_sequence(decode, {next[0]}, 200 + step, blocks(0, 13), false);
      append_sequence(decode, {next[1]}, 77 + step, blocks(13, 8), false);
      std::vector<float> cpu_logits;
      const StepErrors d = run_step(m, decode, &cpu_logits);
      worst_fast = std::max(worst_fast, d.fast);
      worst_builtin = std::max(worst_builtin, d.builtin);
      for (int r = 0; r < 2; ++r) {
        const float* row = cpu_logits.data() + static_cast<size_t>(r) * kVocab;
        next[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
      }
    }
    std::cout << "[ figure ] drift, " << layers << " layers, 6 decode steps in CUDA graphs: worst fast " << worst_fast
              << ", builtin " << worst_builtin << "\n";
    EXPECT_LE(worst_fast, 1.5 * worst_builtin + 0.005) << layers << " layers";
    EXPECT_EQ(m.fast->fast_attention_steps(), 7);
    EXPECT_GE(m.fast->graph_replays(), 5);
    EXPECT_EQ(m.builtin->fast_attention_steps(), 0);
  }
}

// Quantized KV (int8, fp8): decode steps in graphs with fast attention (where
// backend/cuda/attention decodes the format) against the CPU model with the same KV
// format, beside the builtin kernel; prefill runs the builtin kernel in both
// GPU models (backend/cuda/attention refuses quantized prefill).
TEST(FastAttentionDrift, QuantizedKvDecodeIsAsCloseToTheCpuAsBuiltin) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  for (DType kv : {DType::kInt8, DType::kFP8E4M3}) {
    Models m = load_models(4, kv);
    ASSERT_TRUE(m.cpu && m.fast && m.builtin);
    std::mt19937 rng(21);
    std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
    std::vector<int32_t> a(150), b(40);
    for (int32_t& t : a) t = token(rng);
    for (int32_t& t : b) t = token(rng);
    ForwardBatch prefill;
    append_sequence(prefill, a, 0, blocks(0, 13), false);
    append_sequence(prefill, b, 0, blocks(13, 8), false);
    std::vector<float> cpu_logits;
    run_step(m, prefill, &cpu_logits);
    double worst_fast = 0, worst_builtin = 0;
    for (int32_t step = 0; step < 8; ++step) {
      std::vector<int32_t> next(2);
      for (int r = 0; r < 2; ++r) {
        const float* row = cpu_logits.data() + static_cast<size_t>(r) * kVocab;
        next[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
      }
      ForwardBatch decode;
      append_sequence(decode, {next[0]}, 150 + step, blocks(0, 13), false);
      append_sequence(decode, {next[1]}, 40 + step, blocks(13, 8), false);
      const StepErrors e = run_step(m, decode, &cpu_logits);
      worst_fast = std::max(worst_fast, e.fast);
      worst_builtin = std::max(worst_builtin, e.builtin);
    }
    std::cout << "[ figure ] " << dtype_name(kv) << " KV, 4 layers, 8 decode steps in graphs: max|gpu - cpu| / "
              << "max|cpu| fast " << worst_fast << " (" << m.fast->fast_attention_steps()
              << " steps on backend/cuda/attention), builtin " << worst_builtin << "\n";
    EXPECT_LE(worst_fast, 1.5 * worst_builtin + 0.005) << dtype_name(kv);
    EXPECT_GE(m.fast->graph_replays(), 7);
  }
}

// Greedy decoding with fast attention inside the decode graphs gives the CPU
// reference's tokens wherever the CPU's top-1 margin is clear of bf16 noise.
TEST(FastAttentionDrift, GreedyTokensInGraphsAgreeWithTheCpuReference) {
  PAGODA_SKIP_WITHOUT_GPU();
  if (!FastAttention::compiled_in()) GTEST_SKIP() << "backend/cuda/attention not built";
  Models m = load_models(4);
  ASSERT_TRUE(m.cpu && m.fast);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  // Three sequences of different lengths decode together (bucket 4: one padding row).
  const std::vector<int32_t> prompt_lengths = {150, 31, 64};
  ForwardBatch prefill;
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    std::vector<int32_t> p(static_cast<size_t>(prompt_lengths[i]));
    for (int32_t& t : p) t = token(rng);
    append_sequence(prefill, p, 0, blocks(static_cast<int32_t>(i) * 32, 32), false);
  }
  std::vector<float> lc, lf;
  ASSERT_TRUE(m.cpu->forward(prefill, *m.cpu_pool, lc).ok());
  ASSERT_TRUE(m.fast->forward(prefill, *m.fast_pool, lf).ok());
  int32_t agreed = 0, compared = 0;
  std::vector<int32_t> next(3);
  for (int32_t step = 0; step < 40; ++step) {
    for (size_t r = 0; r < 3; ++r) {
      const float* row = lc.data() + r * kVocab;
      std::vector<float> sorted(row, row + kVocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const int32_t cpu_token = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
      const float* grow = lf.data() + r * kVocab;
      const int32_t gpu_token = static_cast<int32_t>(std::max_element(grow, grow + kVocab) - grow);
      if (sorted[0] - sorted[1] > 0.02 * std::abs(sorted[0]) + 1e-3) {
        ++compared;
        agreed += cpu_token == gpu_token;
        EXPECT_EQ(gpu_token, cpu_token) << "step " << step << " row " << r;
      }
      next[r] = cpu_token;  // teacher forcing: both follow the CPU
    }
    ForwardBatch decode;
    for (size_t i = 0; i < 3; ++i)
      append_sequence(decode, {next[i]}, prompt_lengths[i] + step, blocks(static_cast<int32_t>(i) * 32, 32), false);
    ASSERT_TRUE(m.cpu->forward(decode, *m.cpu_pool, lc).ok());
    const Status s = m.fast->forward(decode, *m.fast_pool, lf);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  std::cout << "[ figure ] greedy in graphs with fast attention: " << agreed << "/" << compared
            << " clear-margin tokens equal to the CPU's\n";
  EXPECT_GT(compared, 20);
  EXPECT_EQ(m.fast->fast_attention_steps(), 41);
  EXPECT_GE(m.fast->graph_replays(), 39);
}

}  // namespace
}  // namespace pagoda::cuda
