// Decode attention over a quantized paged pool (fp8, int8, int4, and K int8 /
// V int4): the fast kernel and the naive GPU kernel against float64 attention
// over the dequantized values (kv_quant_reference.h), for MHA, GQA and MQA,
// head dims 64 and 128, block sizes 8 to 64, odd lengths, scattered block
// tables, split-K on and off, graph mode, and for fp8 / int8 / int4 both the
// tensor-core and the CUDA-core loop (K int8 / V int4 runs on CUDA cores only).
// Label gpu; skips without a GPU.

#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_test_support.h"
#include "kv_quant_reference.h"
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/cuda_status.h"

namespace pagoda::kernels::cuda {
namespace {

using kernels::testing::QuantizedPool;
using kernels::testing::quantize_pool;
using testing::DeviceBuffer;
using testing::PagedBatch;
using testing::SequenceShape;

// Against attention over the dequantized values: only f32 accumulation and the
// bf16 output rounding (~2e-3) separate them.
constexpr double kMaxRelativeError = 1e-2;

struct Formats {
  KvElement key, value;
};

std::string name_of(KvElement e) {
  switch (e) {
    case KvElement::kBF16: return "bf16";
    case KvElement::kFP8E4M3: return "fp8";
    case KvElement::kInt8: return "int8";
    case KvElement::kInt4: return "int4";
  }
  return "?";
}

enum class Path { kFast, kNaive, kFastGraph };

// fp8 pools written with one K and one V scale: the fast paths get them as
// per-tensor scales and no scale records at all (null), so a read of one faults.
struct TensorScales {
  float key = 0.0f, value = 0.0f;
};

// Uploads codes, scales and q; plans; launches; returns the bf16 output
// (poisoned with NaN first, so an unwritten element fails).
StatusOr<std::vector<uint16_t>> run_quantized(const PagedBatch& b, const QuantizedPool& key,
                                              const QuantizedPool& value, Path path,
                                              const AttentionPlanOptions& options = {},
                                              TensorScales tensor_scales = {}) {
  cudaDeviceProp prop{};
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  const auto sequences = b.sequences();
  PAGODA_ASSIGN_OR_RETURN(auto plan, PagedAttentionPlan::create(b.config, sequences,
                                                                AttentionDeviceInfo{prop.multiProcessorCount},
                                                                options));
  if (plan.kernel() != AttentionKernel::kDecode) return internal_error("quantized KV planned a prefill kernel");
  // Graph mode pads the rows to graph_sequences: q and out get that many rows.
  const size_t row_elements = size_t(b.config.num_q_heads) * b.config.head_dim;
  const size_t rows = std::max<size_t>(plan.num_tokens(), b.num_tokens);
  DeviceBuffer k(key.codes.size()), v(value.codes.size()), ks(key.records.size() * 4),
      vs(value.records.size() * 4), q(rows * row_elements * 2), out(rows * row_elements * 2),
      arena(std::max(plan.arena_bytes(), plan.arena_capacity_bytes())), workspace(plan.workspace_bytes());
  for (auto* buf : {&k, &v, &ks, &vs, &q, &out, &arena, &workspace})
    if (!buf->ok()) return resource_exhausted_error("cudaMalloc of {} bytes failed", buf->bytes());
  auto up = [](DeviceBuffer& dst, const void* src, size_t bytes) {
    return cudaMemcpy(dst.get(), src, bytes, cudaMemcpyHostToDevice);
  };
  PAGODA_CUDA_RETURN_IF_ERROR(up(k, key.codes.data(), key.codes.size()));
  PAGODA_CUDA_RETURN_IF_ERROR(up(v, value.codes.data(), value.codes.size()));
  PAGODA_CUDA_RETURN_IF_ERROR(up(ks, key.records.data(), key.records.size() * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(up(vs, value.records.data(), value.records.size() * 4));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(q.get(), 0, q.bytes()));
  PAGODA_CUDA_RETURN_IF_ERROR(up(q, b.q.data(), b.q.size() * 2));
  PAGODA_CUDA_RETURN_IF_ERROR(up(arena, plan.arena().data(), plan.arena_bytes()));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(out.get(), 0xff, out.bytes()));
  PagedKvPointers pointers{k.get(), v.get(), ks.get(), vs.get()};
  if (tensor_scales.key > 0.0f && path != Path::kNaive) {
    pointers = {k.get(), v.get(), nullptr, nullptr, tensor_scales.key, tensor_scales.value};
  }
  const AttentionDescriptor desc = plan.descriptor(arena.get<int32_t>(), pointers, workspace.get<float>());
  cudaStream_t stream;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  cudaError_t err = cudaSuccess;
  if (path == Path::kNaive) {
    err = launch_naive_paged_attention(desc, q.get(), out.get(), b.max_length(), stream);
  } else if (path == Path::kFast) {
    err = launch_paged_attention(desc, q.get(), out.get(), stream);
  } else {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    PAGODA_CUDA_RETURN_IF_ERROR(prepare_paged_attention_kernels());
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    err = launch_paged_attention(desc, q.get(), out.get(), stream);
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  PAGODA_RETURN_IF_ERROR(cuda_status(err, "quantized attention", __FILE__, __LINE__));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
  std::vector<uint16_t> host(rows * row_elements);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), out.get(), host.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = b.q.size(); i < host.size(); ++i) {
    if (host[i] != 0) return internal_error("padding row element {} is {:#x}, not 0", i, host[i]);
  }
  host.resize(b.q.size());
  return host;
}

struct Case {
  Formats formats;
  int32_t q_heads, kv_heads, head_dim, block_size;
  // fp8 only, > 0: quantize with one scale of amax(pool) / 448 times this
  // (K and V alike; below 1 clips the tails) and decode with per-tensor scales.
  float tensor_scale_fraction = 0.0f;
};

float pool_amax(const std::vector<float>& x) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  return amax;
}

// value_gain(vector index) multiplies each V vector of the pool before quantization.
void check_case(const Case& c, const std::vector<SequenceShape>& shapes, uint32_t seed, Path path,
                const AttentionPlanOptions& options = {}, float (*value_gain)(size_t) = nullptr) {
  PagedBatch b = testing::make_paged_batch(c.q_heads, c.kv_heads, c.head_dim, c.block_size, shapes, seed);
  b.config.key_element = c.formats.key;
  b.config.value_element = c.formats.value;
  std::vector<float> values = testing::bf16_to_floats(b.value);
  if (value_gain != nullptr) {
    for (size_t i = 0; i < values.size(); ++i) values[i] *= value_gain(i / size_t(c.head_dim));
  }
  const std::vector<float> keys = testing::bf16_to_floats(b.key);
  TensorScales tensor;
  if (c.tensor_scale_fraction > 0.0f) {
    tensor.key = pool_amax(keys) / kKvFp8Max * c.tensor_scale_fraction;
    tensor.value = pool_amax(values) / kKvFp8Max * c.tensor_scale_fraction;
  }
  const QuantizedPool key = quantize_pool(keys, c.head_dim, static_cast<KvQuant>(c.formats.key), c.block_size,
                                          c.kv_heads, tensor.key);
  const QuantizedPool value = quantize_pool(values, c.head_dim, static_cast<KvQuant>(c.formats.value), c.block_size,
                                            c.kv_heads, tensor.value);
  const std::string label = "K " + name_of(c.formats.key) + " V " + name_of(c.formats.value) + " heads " +
                            std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " d=" +
                            std::to_string(c.head_dim) + " block " + std::to_string(c.block_size) + " path " +
                            std::to_string(static_cast<int>(path)) +
                            (options.decode_cuda_cores ? " cuda-cores" : "") +
                            (tensor.key > 0.0f ? " per-tensor scales" : "");
  auto got = run_quantized(b, key, value, path, options, tensor);
  ASSERT_TRUE(got.ok()) << label << ": " << got.status().to_string();
  const double err = testing::relative_l2(*got, testing::reference_attention(b, key.values, value.values));
  std::printf("[%s] rel L2 %.2e\n", label.c_str(), err);
  EXPECT_LE(err, kMaxRelativeError) << label;
}

const Formats kAllFormats[] = {{KvElement::kFP8E4M3, KvElement::kFP8E4M3},
                               {KvElement::kInt8, KvElement::kInt8},
                               {KvElement::kInt4, KvElement::kInt4},
                               {KvElement::kInt8, KvElement::kInt4}};

TEST(QuantizedDecodeAttention, EveryFormatHeadLayoutHeadDimAndBlockSize) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  // Odd lengths, one of 1 (only the new token), one that ends mid-block.
  const std::vector<SequenceShape> shapes = {{1, 0}, {1, 36}, {1, 300}, {1, 777}};
  uint32_t seed = 1;
  for (const Formats& f : kAllFormats) {
    for (auto [qh, kvh] : {std::pair{8, 2}, {8, 8}, {8, 1}, {4, 2}}) {
      for (int32_t d : {64, 128}) {
        for (int32_t bs : {8, 16, 32, 64}) {
          check_case({f, qh, kvh, d, bs}, shapes, seed, Path::kFast);
          if (f.key == f.value) {  // the CUDA-core loop of fp8 / int8 / int4 too
            AttentionPlanOptions cuda_cores;
            cuda_cores.decode_cuda_cores = true;
            check_case({f, qh, kvh, d, bs}, shapes, seed, Path::kFast, cuda_cores);
          }
          ++seed;
        }
      }
    }
  }
}

// Blocks of 1, 2 and 4 positions: the tensor-core kernel copies the scale
// records of 4 positions with one 16-byte copy where a block holds 4 or more
// ([block, head, slot] layout), and one record at a time below that.
TEST(QuantizedDecodeAttention, BlocksSmallerThanFourPositions) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const std::vector<SequenceShape> shapes = {{1, 0}, {1, 5}, {1, 130}, {1, 257}};
  AttentionPlanOptions split;
  split.split_tokens = 64;
  uint32_t seed = 500;
  for (const Formats& f : {kAllFormats[0], kAllFormats[1], kAllFormats[2]}) {
    for (int32_t bs : {1, 2, 4}) {
      check_case({f, 8, 2, 128, bs}, shapes, seed++, Path::kFast);
      check_case({f, 4, 4, 64, bs}, shapes, seed++, Path::kFast, split);
    }
  }
}

TEST(QuantizedDecodeAttention, SplitKMergeAndGraphModeAndLongContext) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  AttentionPlanOptions split;
  split.split_tokens = 96;  // many splits, boundaries not on tiles
  AttentionPlanOptions graph;
  graph.graph_sequences = 6;  // two padding rows
  graph.graph_block_table_stride = 1024;
  uint32_t seed = 100;
  for (const Formats& f : kAllFormats) {
    check_case({f, 32, 8, 128, 16}, {{1, 1000}, {1, 4095}, {1, 5}}, seed++, Path::kFast, split);
    check_case({f, 32, 8, 128, 16}, {{1, 3000}, {1, 17}, {1, 700}, {1, 1}}, seed++, Path::kFastGraph, graph);
    check_case({f, 16, 16, 64, 32}, {{1, 6000}}, seed++, Path::kFast);
    graph.decode_cuda_cores = true;  // both decode loops in graph mode
    check_case({f, 32, 8, 128, 16}, {{1, 2000}, {1, 9}}, seed++, Path::kFastGraph, graph);
    graph.decode_cuda_cores = false;
  }
}

// The tensor-core kernel's warps carry their pipelines from unit to unit (a CTA
// walks units blockIdx.x, + gridDim.x, ...). Many short, uneven sequences give
// thousands of units, units where some warps have no tile at all, and ranges
// ending mid-tile; a split of 48 adds merged units.
TEST(QuantizedDecodeAttention, ManyShortUnevenUnitsAndSplits) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  std::vector<SequenceShape> shapes;
  for (int32_t i = 0; i < 160; ++i) shapes.push_back({1, (i * 37) % 150});  // 0..149 cached tokens
  AttentionPlanOptions split;
  split.split_tokens = 48;
  uint32_t seed = 300;
  for (const Formats& f : {kAllFormats[0], kAllFormats[1], kAllFormats[2]}) {
    check_case({f, 32, 8, 128, 16}, shapes, seed++, Path::kFast);
    check_case({f, 32, 8, 128, 16}, shapes, seed++, Path::kFast, split);
    check_case({f, 16, 4, 64, 8}, shapes, seed++, Path::kFast);
  }
}

// The tensor-core kernel rounds p * v_scale / U to f16, U a largest V scale
// (of the tile; of all tiles so far in 738b129's variant), and carries U in its
// accumulators from tile to tile. V scales spread over 2^18 (scattered vectors
// 256x larger, others 1/1024): U changes between tiles and small-scale tokens
// sit far below it. (Passed on the H200 with 738b129's variant as the default.)
TEST(QuantizedDecodeAttention, VScalesSpreadOverManyOctaves) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  auto gain = [](size_t vector) -> float {
    if (vector % 97 == 5) return 256.0f;
    if (vector % 89 == 3 || vector % 7 == 1) return 1.0f / 1024.0f;
    return 1.0f;
  };
  AttentionPlanOptions split;
  split.split_tokens = 1024;
  uint32_t seed = 400;
  for (const Formats& f : kAllFormats) {
    check_case({f, 32, 8, 128, 16}, {{1, 3000}, {1, 777}, {1, 40}}, seed++, Path::kFast, {}, gain);
    check_case({f, 32, 8, 128, 16}, {{1, 5000}}, seed++, Path::kFast, split, gain);
    check_case({f, 16, 16, 64, 8}, {{1, 2500}}, seed++, Path::kFast, {}, gain);
  }
}

// fp8 with a checkpoint's per-tensor K / V scales: the tensor-core decode reads
// no scale records (the fast paths get null record pointers), for MHA, GQA and
// MQA, both head dims, odd lengths, splits and graph mode; a fraction below 1
// saturates the tails (the reference holds the same saturated values); the
// naive kernel reads the same pool's records (each holding the tensor scale).
TEST(QuantizedDecodeAttention, Fp8PerTensorScalesReadNoRecords) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const Formats fp8 = kAllFormats[0];
  AttentionPlanOptions split;
  split.split_tokens = 96;
  AttentionPlanOptions graph;
  graph.graph_sequences = 5;
  graph.graph_block_table_stride = 512;
  uint32_t seed = 600;
  for (float fraction : {1.0f, 0.6f}) {
    check_case({fp8, 32, 8, 128, 16, fraction}, {{1, 1000}, {1, 4095}, {1, 5}, {1, 0}}, seed++, Path::kFast);
    check_case({fp8, 32, 8, 128, 16, fraction}, {{1, 3000}, {1, 17}}, seed++, Path::kFast, split);
    check_case({fp8, 32, 8, 128, 16, fraction}, {{1, 2000}, {1, 9}, {1, 300}}, seed++, Path::kFastGraph, graph);
    check_case({fp8, 16, 16, 64, 8, fraction}, {{1, 777}, {1, 64}}, seed++, Path::kFast);
    check_case({fp8, 8, 1, 128, 32, fraction}, {{1, 1500}, {1, 31}}, seed++, Path::kFast, split);
    check_case({fp8, 6, 3, 64, 1, fraction}, {{1, 130}, {1, 257}}, seed++, Path::kFast);
    check_case({fp8, 8, 2, 128, 16, fraction}, {{1, 50}, {1, 333}}, seed++, Path::kNaive);
  }
}

TEST(QuantizedDecodeAttention, NaiveKernelReadsEveryFormat) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 200;
  for (const Formats& f : kAllFormats)
    check_case({f, 8, 2, 128, 16}, {{1, 50}, {1, 333}}, seed++, Path::kNaive);
}

TEST(QuantizedDecodeAttention, MissingScalesAreALaunchErrorNotACrash) {
  if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  PagedBatch b = testing::make_paged_batch(8, 2, 128, 16, {{1, 20}}, 7);
  b.config.key_element = b.config.value_element = KvElement::kInt8;
  auto plan = PagedAttentionPlan::create(b.config, b.sequences());
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  DeviceBuffer arena(plan->arena_bytes());
  const AttentionDescriptor desc =
      plan->descriptor(arena.get<int32_t>(), PagedKvPointers{arena.get(), arena.get(), nullptr, nullptr}, nullptr);
  EXPECT_EQ(launch_paged_attention(desc, arena.get(), arena.get(), nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace pagoda::kernels::cuda
