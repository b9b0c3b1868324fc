// The paged MLA decode kernel (backend/cuda/attention/mla_decode.h) against
// float64 absorbed attention over the pool's values (bf16, or the fp8 codes
// dequantized as runtime/kv_quant.h says): heads 16 and 128 (and partial head
// tiles), block sizes 1 / 16 / 64, ragged context lengths from 1 to several
// thousand, scattered block tables, rows sharing blocks (prefill-style rows of
// one sequence, a forked prefix), the automatic schedule (one segment or
// several per CTA, rows cut across CTAs) and fixed small splits (the merge).
// FlashMLA's 656-byte fp8 records (runtime/mla_fp8_layout.h) against the same
// float64 reference over their dequantized values, and against the bf16 pool of
// the same latent. Outputs are poisoned with NaN first. Label gpu; skips
// without a GPU.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_support.h"
#include "kv_quant_reference.h"
#include "pagoda/backend/cuda/attention/cuda_status.h"
#include "pagoda/backend/cuda/attention/mla_decode.h"
#include "pagoda/core/dtype.h"
#include "pagoda/runtime/mla_fp8_layout.h"
#include "pagoda/runtime/mla_latent_layout.h"

namespace pagoda::kernels::cuda {
namespace {

using testing::DeviceBuffer;

// bf16 operands (q, the pool, P) and a bf16 output: ~3e-3 typical.
constexpr double kMaxRelativeError = 1e-2;

struct Row {
  int32_t sequence;
  int32_t context_len;
};

struct MlaCase {
  std::string name;
  int32_t heads = 16;
  int32_t block_size = 16;
  KvElement element = KvElement::kBF16;
  MlaLatentLayout layout = MlaLatentLayout::kPerVectorScale;
  std::vector<int32_t> sequence_lengths;
  std::vector<Row> rows;  // empty: one row per sequence over its whole length
  MlaDecodeOptions options;
  int32_t num_sms = 0;  // 0: the device's
  int32_t shared_prefix_blocks = 0;  // sequence 1 starts with sequence 0's first blocks (a fork)
  uint32_t seed = 1;
  // bf16: every pool slot outside the sequences' [0, length) holds NaN (a
  // kernel that lets a partial page's unused rows into 0 x V shows it).
  bool poison_unused = false;
  // Launch through a captured CUDA graph (a non-default stream) instead of directly.
  bool use_graph = false;
  // MlaDecodeDescriptor::programmatic_merge: the merge pass as a programmatic dependent launch.
  bool programmatic_merge = false;
  // Direct launches back to back (the folded merge's counters must be back at zero after each).
  int launches = 1;
};

struct MlaBatch {
  MlaDecodeConfig config;
  std::vector<std::vector<int32_t>> tables;
  std::vector<Row> rows;
  std::vector<uint8_t> codes;      // bf16 or fp8 codes, [num_blocks, block_size, 576]
  std::vector<uint32_t> records;   // fp8 scales (f32 bits), one a slot
  std::vector<float> values;       // what the codes mean, [num_blocks * block_size, 576]
  std::vector<uint16_t> q;         // [rows, heads, 576] bf16
};

MlaCase make_case(std::string name, int32_t heads, int32_t block_size, KvElement element,
                  std::vector<int32_t> lengths, uint32_t seed) {
  MlaCase c;
  c.name = std::move(name);
  c.heads = heads;
  c.block_size = block_size;
  c.element = element;
  c.sequence_lengths = std::move(lengths);
  c.seed = seed;
  return c;
}
MlaCase with_options(MlaCase c, int32_t split_tokens, int32_t num_sms) {
  c.options.split_tokens = split_tokens;
  c.num_sms = num_sms;
  return c;
}

MlaBatch make_batch(const MlaCase& c) {
  std::mt19937 rng(c.seed);
  MlaBatch b;
  int32_t blocks_needed = 0;
  for (int32_t len : c.sequence_lengths) blocks_needed += (len + c.block_size - 1) / c.block_size;
  const int32_t num_blocks = blocks_needed + blocks_needed / 3 + 2;
  b.config = MlaDecodeConfig{c.heads, c.block_size, num_blocks, 1.0f / std::sqrt(192.0f), c.element, c.layout};
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  for (size_t s = 0; s < c.sequence_lengths.size(); ++s) {
    const int32_t n = (c.sequence_lengths[s] + c.block_size - 1) / c.block_size;
    std::vector<int32_t> table(ids.begin() + ptrdiff_t(next), ids.begin() + ptrdiff_t(next + n));
    next += size_t(n);
    if (s == 1 && c.shared_prefix_blocks > 0)
      for (int32_t i = 0; i < std::min<int32_t>(c.shared_prefix_blocks, n); ++i) table[i] = b.tables[0][i];
    b.tables.push_back(std::move(table));
  }
  b.rows = c.rows;
  if (b.rows.empty())
    for (size_t s = 0; s < c.sequence_lengths.size(); ++s) b.rows.push_back({int32_t(s), c.sequence_lengths[s]});

  // Latent values of mixed magnitude (some tokens larger) so softmax is peaked; never zeros.
  const size_t slots = size_t(num_blocks) * c.block_size;
  std::vector<float> x(slots * kMlaKeyDim);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), gain(0.5f, 2.0f);
  for (size_t v = 0; v < slots; ++v) {
    const float g = gain(rng);
    for (int32_t i = 0; i < kMlaKeyDim; ++i) x[v * kMlaKeyDim + i] = g * unit(rng);
  }
  if (c.element == KvElement::kBF16) {
    b.codes.resize(x.size() * 2);
    b.values.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t h = f32_to_bf16(x[i]);
      std::memcpy(&b.codes[2 * i], &h, 2);
      b.values[i] = bf16_to_f32(h);
    }
  } else if (c.layout == MlaLatentLayout::kFlashMla656) {
    b.codes.resize(slots * kMlaFp8VectorBytes);
    b.values.resize(x.size());
    for (size_t v = 0; v < slots; ++v) {
      uint8_t* record = &b.codes[v * kMlaFp8VectorBytes];
      mla_fp8_quantize(&x[v * kMlaKeyDim], record);
      for (int32_t i = 0; i < kMlaKeyDim; ++i) b.values[v * kMlaKeyDim + i] = mla_fp8_value(record, i);
    }
  } else {
    auto pool = kernels::testing::quantize_pool(x, kMlaKeyDim, KvQuant::kFP8E4M3, c.block_size, 1);
    b.codes = std::move(pool.codes);
    b.records = std::move(pool.records);
    b.values = std::move(pool.values);
  }
  b.q.resize(b.rows.size() * size_t(c.heads) * kMlaKeyDim);
  for (auto& e : b.q) e = f32_to_bf16(unit(rng));
  const bool flash = c.element != KvElement::kBF16 && c.layout == MlaLatentLayout::kFlashMla656;
  if (c.poison_unused && (c.element == KvElement::kBF16 || flash)) {
    std::vector<bool> used(slots, false);
    for (size_t s = 0; s < c.sequence_lengths.size(); ++s)
      for (int32_t p = 0; p < c.sequence_lengths[s]; ++p)
        used[size_t(b.tables[s][size_t(p / c.block_size)]) * c.block_size + size_t(p % c.block_size)] = true;
    const uint16_t nan = 0x7fc0;
    const uint32_t nan32 = 0x7fc00000u;
    for (size_t v = 0; v < slots; ++v) {
      if (used[v]) continue;
      if (!flash) {
        for (int32_t i = 0; i < kMlaKeyDim; ++i) std::memcpy(&b.codes[2 * (v * kMlaKeyDim + size_t(i))], &nan, 2);
        continue;
      }
      // FlashMLA records: NaN codes (e4m3 0x7f), NaN scales and NaN rope values.
      uint8_t* record = &b.codes[v * kMlaFp8VectorBytes];
      std::memset(record, 0x7f, size_t(kMlaFp8LatentValues));
      for (int32_t k = 0; k < kMlaFp8Groups; ++k) std::memcpy(record + kMlaFp8ScalesAt + 4 * k, &nan32, 4);
      for (int32_t i = 0; i < kMlaFp8RopeValues; ++i) std::memcpy(record + kMlaFp8RopeAt + 2 * i, &nan, 2);
    }
  }
  if (c.layout == MlaLatentLayout::kBf16SwizzledPages) {  // the same rows, where swizzled pages keep them
    std::vector<uint8_t> paged(b.codes.size());
    runtime::mla_latent_relayout(reinterpret_cast<const std::byte*>(b.codes.data()),
                                 reinterpret_cast<std::byte*>(paged.data()), num_blocks, c.block_size, kMlaKeyDim,
                                 runtime::MlaLatentPages::kTokenMajor, runtime::MlaLatentPages::kSwizzled128);
    b.codes = std::move(paged);
  }
  return b;
}

// float64 softmax(q . K * scale) V per (row, head) over the pool's values.
std::vector<double> reference(const MlaBatch& b) {
  const auto& c = b.config;
  std::vector<double> out(b.rows.size() * size_t(c.num_heads) * kMlaLatentDim, 0.0);
  std::vector<double> scores, qd(kMlaKeyDim);
  for (size_t r = 0; r < b.rows.size(); ++r) {
    const auto& table = b.tables[size_t(b.rows[r].sequence)];
    const int32_t len = b.rows[r].context_len;
    auto at = [&](int32_t p) {
      return (size_t(table[size_t(p / c.block_size)]) * c.block_size + size_t(p % c.block_size)) * kMlaKeyDim;
    };
    for (int32_t h = 0; h < c.num_heads; ++h) {
      const uint16_t* qv = &b.q[(r * size_t(c.num_heads) + size_t(h)) * kMlaKeyDim];
      for (int32_t i = 0; i < kMlaKeyDim; ++i) qd[size_t(i)] = bf16_to_f32(qv[i]);
      scores.assign(size_t(len), 0.0);
      double mx = -1e300;
      for (int32_t p = 0; p < len; ++p) {
        const float* k = &b.values[at(p)];
        double dot = 0;
        for (int32_t i = 0; i < kMlaKeyDim; ++i) dot += qd[size_t(i)] * k[i];
        scores[size_t(p)] = dot * c.scale;
        mx = std::max(mx, scores[size_t(p)]);
      }
      double sum = 0;
      for (auto& s : scores) sum += (s = std::exp(s - mx));
      double* o = &out[(r * size_t(c.num_heads) + size_t(h)) * kMlaLatentDim];
      for (int32_t p = 0; p < len; ++p) {
        const float* v = &b.values[at(p)];
        const double w = scores[size_t(p)] / sum;
        for (int32_t i = 0; i < kMlaLatentDim; ++i) o[i] += w * v[i];
      }
    }
  }
  return out;
}

StatusOr<std::vector<uint16_t>> run(const MlaBatch& b, const MlaCase& c, MlaDecodePlan* plan_out = nullptr) {
  cudaDeviceProp prop{};
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::vector<MlaDecodeRow> rows;
  for (const auto& r : b.rows) rows.push_back({r.context_len, b.tables[size_t(r.sequence)]});
  const AttentionDeviceInfo device{c.num_sms > 0 ? c.num_sms : prop.multiProcessorCount};
  PAGODA_ASSIGN_OR_RETURN(auto plan, MlaDecodePlan::create(b.config, rows, device, c.options));
  const size_t out_rows = std::max(b.rows.size(), size_t(std::max(0, c.options.fixed_rows)));
  const size_t out_elements = out_rows * size_t(b.config.num_heads) * kMlaLatentDim;
  DeviceBuffer codes(b.codes.size()), records(b.records.size() * 4), q(b.q.size() * 2), out(out_elements * 2),
      arena(plan.arena_bytes()), workspace(plan.workspace_bytes());
  for (auto* buf : {&codes, &records, &q, &out, &arena, &workspace})
    if (!buf->ok()) return resource_exhausted_error("cudaMalloc of {} bytes failed", buf->bytes());
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(codes.get(), b.codes.data(), b.codes.size(), cudaMemcpyHostToDevice));
  if (!b.records.empty())
    PAGODA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(records.get(), b.records.data(), b.records.size() * 4, cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(q.get(), b.q.data(), b.q.size() * 2, cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(arena.get(), plan.arena().data(), plan.arena_bytes(), cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(out.get(), 0xff, out_elements * 2));  // NaN
  if (workspace.bytes() > 0) PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(workspace.get(), 0xff, workspace.bytes()));
  auto desc = plan.descriptor(arena.get<int32_t>(), codes.get(), b.records.empty() ? nullptr : records.get(),
                              workspace.get<float>());
  desc.programmatic_merge = c.programmatic_merge;
  if (!c.use_graph) {
    for (int i = 0; i < c.launches; ++i)
      PAGODA_CUDA_RETURN_IF_ERROR(launch_mla_decode(desc, q.get(), out.get(), nullptr));
  } else {
    PAGODA_CUDA_RETURN_IF_ERROR(prepare_mla_decode_kernels());
    cudaStream_t stream = nullptr;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
      const cudaError_t launched = launch_mla_decode(desc, q.get(), out.get(), stream);
      e = cudaStreamEndCapture(stream, &graph);
      if (launched != cudaSuccess) e = launched;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    // Replayed twice: the second replay must give the same output.
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = cudaGraphLaunch(exec, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    PAGODA_CUDA_RETURN_IF_ERROR(e);
  }
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::vector<uint16_t> host(out_elements);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), out.get(), out_elements * 2, cudaMemcpyDeviceToHost));
  const bool tma_asked = is_tma_kernel(c.options.kernel);
  if (tma_asked && plan.kernel() != c.options.kernel)
    return internal_error("{}: the plan took kernel {} instead of {}", c.name, static_cast<int>(plan.kernel()),
                          static_cast<int>(c.options.kernel));
  if (plan_out) *plan_out = std::move(plan);
  return host;
}

const char* kernel_name(MlaDecodeKernel k) {
  switch (k) {
    case MlaDecodeKernel::kTma: return "tma";
    case MlaDecodeKernel::kTmaTile: return "tma_tile";
    case MlaDecodeKernel::kTmaPair: return "tma_pair";
    case MlaDecodeKernel::kTmaPairTile: return "tma_pair_tile";
    case MlaDecodeKernel::kTmaPingPong: return "tma_pingpong";
    case MlaDecodeKernel::kTmaFastExp: return "tma_fast_exp";
    case MlaDecodeKernel::kTmaPingPongFastExp: return "tma_pingpong_fast_exp";
    case MlaDecodeKernel::kTmaPingPongTurns: return "tma_pingpong_turns";
    case MlaDecodeKernel::kTmaPingPongTwoChains: return "tma_pingpong_2chain";
    case MlaDecodeKernel::kTmaPingPongAll: return "tma_pingpong_all";
    case MlaDecodeKernel::kTmaPingPongSplit: return "tma_pingpong_split";
    case MlaDecodeKernel::kTmaPingPongSplitTwoChains: return "tma_pingpong_split_2chain";
    case MlaDecodeKernel::kTmaFp8: return "tma_fp8";
    case MlaDecodeKernel::kBulkPingPongTwoChains: return "bulk_pingpong_2chain";
    default: return "cp.async";
  }
}

// Overall and worst per-row relative L2 error (inf on any NaN / Inf).
void expect_close(const MlaCase& c) {
  const MlaBatch b = make_batch(c);
  MlaDecodePlan plan = MlaDecodePlan::create(b.config, {}).value();
  auto got = run(b, c, &plan);
  ASSERT_TRUE(got.ok()) << c.name << ": " << got.status().message();
  // A fixed plan's padding rows (past the real ones) must be zeros.
  const size_t real = b.rows.size() * size_t(c.heads) * kMlaLatentDim;
  for (size_t i = real; i < got->size(); ++i) ASSERT_EQ((*got)[i], 0) << c.name << ": padding element " << i;
  got->resize(real);
  const auto want = reference(b);
  const double overall = testing::relative_l2(*got, want);
  double worst = 0.0;
  const size_t per_row = size_t(c.heads) * kMlaLatentDim;
  for (size_t r = 0; r < b.rows.size(); ++r) {
    std::vector<uint16_t> g(got->begin() + ptrdiff_t(r * per_row), got->begin() + ptrdiff_t((r + 1) * per_row));
    std::vector<double> w(want.begin() + ptrdiff_t(r * per_row), want.begin() + ptrdiff_t((r + 1) * per_row));
    worst = std::max(worst, testing::relative_l2(g, w));
  }
  std::printf("%-40s %-13s rows %3zu segments %4d ctas %4d max_splits %3d  rel L2 %.2e (worst row %.2e)\n",
              c.name.c_str(), kernel_name(plan.kernel()), b.rows.size(),
              plan.num_segments(), plan.num_ctas(), plan.max_splits(), overall, worst);
  EXPECT_LT(overall, kMaxRelativeError) << c.name;
  EXPECT_LT(worst, 2 * kMaxRelativeError) << c.name;
}

class MlaDecodeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(MlaDecodeGpuTest, Bf16Heads16RaggedBlock16) {
  expect_close(make_case("bf16 h16 bs16 ragged", 16, 16, KvElement::kBF16, {1, 17, 64, 65, 300, 1000, 4097}, 1));
}

TEST_F(MlaDecodeGpuTest, Bf16Heads128Block64) {
  expect_close(make_case("bf16 h128 bs64 ragged", 128, 64, KvElement::kBF16, {1, 63, 129, 2000, 5000}, 2));
}

TEST_F(MlaDecodeGpuTest, Bf16Block1) {
  expect_close(make_case("bf16 h16 bs1", 16, 1, KvElement::kBF16, {1, 2, 3, 130, 777}, 3));
}

TEST_F(MlaDecodeGpuTest, Fp8Heads16Block1) {
  expect_close(make_case("fp8 h16 bs1", 16, 1, KvElement::kFP8E4M3, {1, 2, 100, 777}, 4));
}

TEST_F(MlaDecodeGpuTest, Fp8Heads16Block16Long) {
  expect_close(make_case("fp8 h16 bs16 ragged", 16, 16, KvElement::kFP8E4M3, {5, 64, 1500, 6000}, 5));
}

TEST_F(MlaDecodeGpuTest, Fp8Heads128Block64) {
  expect_close(make_case("fp8 h128 bs64 ragged", 128, 64, KvElement::kFP8E4M3, {3, 64, 1500, 3000}, 6));
}

TEST_F(MlaDecodeGpuTest, PartialHeadTiles) {
  expect_close(make_case("bf16 h20 bs16", 20, 16, KvElement::kBF16, {33, 700}, 7));
  expect_close(make_case("fp8 h96 bs64", 96, 64, KvElement::kFP8E4M3, {1, 900}, 8));
  // Fewer than 16 heads (e.g. DeepSeek-V2-Lite's 16 split over tensor-parallel ranks): the narrow kernel's padding.
  expect_close(make_case("bf16 h8 bs16", 8, 16, KvElement::kBF16, {1, 500}, 20));
  expect_close(make_case("fp8 h1 bs64", 1, 64, KvElement::kFP8E4M3, {64, 129}, 21));
}

TEST_F(MlaDecodeGpuTest, FixedSmallSplitsMerge) {
  expect_close(with_options(make_case("bf16 h16 split 64", 16, 16, KvElement::kBF16, {1, 100, 1000, 2500}, 9), 64, 0));
  // 100 is rounded up to 128.
  expect_close(with_options(make_case("fp8 h128 split 128", 128, 16, KvElement::kFP8E4M3, {7, 333, 1200}, 10), 100, 0));
}

TEST_F(MlaDecodeGpuTest, FewSmsManySegmentsPerCta) {
  // 7 SMs: the automatic schedule cuts rows across CTAs and gives CTAs several segments.
  expect_close(with_options(make_case("bf16 h16 7 sms", 16, 16, KvElement::kBF16, {1, 5, 70, 300, 1000, 2000, 64, 3}, 11), 0, 7));
  expect_close(with_options(make_case("fp8 h128 5 sms", 128, 64, KvElement::kFP8E4M3, {129, 1, 2000, 40}, 12), 0, 5));
}

TEST_F(MlaDecodeGpuTest, FixedModeForGraphsPadsWithZeros) {
  // The CUDA-graph layout: 8 fixed rows (3 padding), tables at a stride of 400 blocks.
  MlaCase c = make_case("bf16 h16 fixed 8", 16, 16, KvElement::kBF16, {1, 70, 3000, 640, 5}, 22);
  c.options.fixed_rows = 8;
  c.options.fixed_block_table_stride = 400;
  expect_close(c);
  MlaCase f = make_case("fp8 h16 bs1 fixed 4", 16, 1, KvElement::kFP8E4M3, {2, 300, 1000}, 23);
  f.options.fixed_rows = 4;
  f.options.fixed_block_table_stride = 1000;
  expect_close(f);
  MlaCase w = make_case("bf16 h128 bs64 fixed 3", 128, 64, KvElement::kBF16, {65, 2000}, 24);
  w.options.fixed_rows = 3;
  w.options.fixed_block_table_stride = 40;
  expect_close(w);
}

TEST_F(MlaDecodeGpuTest, LongSegmentsOneSm) {
  // One SM: every row in one CTA, segments of many tiles (the copies run two tiles ahead).
  expect_close(with_options(make_case("bf16 h16 1 sm", 16, 16, KvElement::kBF16, {1000, 130}, 16), 0, 1));
  expect_close(with_options(make_case("fp8 h16 1 sm", 16, 16, KvElement::kFP8E4M3, {1000, 130}, 17), 0, 1));
  expect_close(with_options(make_case("bf16 h128 1 sm", 128, 64, KvElement::kBF16, {700, 3}, 18), 0, 1));
  expect_close(with_options(make_case("fp8 h128 1 sm", 128, 64, KvElement::kFP8E4M3, {700, 3}, 19), 0, 1));
}

MlaCase flash(MlaCase c) {
  c.layout = MlaLatentLayout::kFlashMla656;
  return c;
}

TEST_F(MlaDecodeGpuTest, FlashMla656Records) {
  // FlashMLA's fp8 layout, read straight from the 656-byte records: blocks of
  // 64 / 16 / 1, ragged ends, the automatic schedule, fixed small splits (the
  // merge), one SM (long segments), a graph plan with padding, fewer heads.
  expect_close(flash(make_case("fp8-656 h16 bs64", 16, 64, KvElement::kFP8E4M3, {1, 63, 64, 65, 2000, 4100}, 50)));
  expect_close(flash(make_case("fp8-656 h16 bs16", 16, 16, KvElement::kFP8E4M3, {5, 64, 1500, 6000}, 51)));
  expect_close(flash(make_case("fp8-656 h16 bs1", 16, 1, KvElement::kFP8E4M3, {1, 2, 100, 777}, 52)));
  expect_close(
      flash(with_options(make_case("fp8-656 h16 split 64", 16, 16, KvElement::kFP8E4M3, {1, 100, 1000}, 53), 64, 0)));
  expect_close(flash(with_options(make_case("fp8-656 h16 1 sm", 16, 64, KvElement::kFP8E4M3, {1000, 130}, 54), 0, 1)));
  expect_close(flash(make_case("fp8-656 h8 bs16", 8, 16, KvElement::kFP8E4M3, {1, 500}, 55)));
  MlaCase f = flash(make_case("fp8-656 h16 fixed 4", 16, 16, KvElement::kFP8E4M3, {2, 300, 1000}, 56));
  f.options.fixed_rows = 4;
  f.options.fixed_block_table_stride = 100;
  expect_close(f);
}

TEST_F(MlaDecodeGpuTest, FlashMla656RecordsWideHeads) {
  // The 64-head-tile kernel on the records (DeepSeek V2/V3's 128 heads): blocks
  // of 64 / 16 / 1 with partial last pages, partial head tiles (96, and 17:
  // just past the narrow kernel), the automatic schedule on few SMs, fixed
  // small splits (the merge), a graph plan with padding, rows sharing blocks.
  // (Long segments on one SM: FlashMla656WideHeadsLongSegmentsOneSm.)
  expect_close(flash(make_case("fp8-656 h128 bs64", 128, 64, KvElement::kFP8E4M3, {1, 63, 64, 65, 2000, 4100}, 70)));
  expect_close(flash(make_case("fp8-656 h128 bs16", 128, 16, KvElement::kFP8E4M3, {5, 64, 1500, 3001}, 71)));
  expect_close(flash(make_case("fp8-656 h128 bs1", 128, 1, KvElement::kFP8E4M3, {1, 2, 100, 777}, 72)));
  expect_close(flash(make_case("fp8-656 h96 bs64", 96, 64, KvElement::kFP8E4M3, {1, 900}, 73)));
  expect_close(flash(make_case("fp8-656 h17 bs16", 17, 16, KvElement::kFP8E4M3, {33, 700}, 74)));
  const KvElement fp8 = KvElement::kFP8E4M3;
  expect_close(flash(with_options(make_case("fp8-656 h128 5 sms", 128, 64, fp8, {129, 1, 2000, 40}, 75), 0, 5)));
  expect_close(flash(with_options(make_case("fp8-656 h128 split 128", 128, 16, fp8, {7, 333, 1200}, 76), 100, 0)));
  MlaCase f = flash(make_case("fp8-656 h128 fixed 3", 128, 64, KvElement::kFP8E4M3, {65, 2000}, 78));
  f.options.fixed_rows = 3;
  f.options.fixed_block_table_stride = 40;
  expect_close(f);
  MlaCase shared = flash(make_case("fp8-656 h128 bs16 prefill rows + fork", 128, 16, fp8, {300, 200}, 79));
  for (int32_t p = 250; p < 300; ++p) shared.rows.push_back({0, p + 1});
  shared.rows.push_back({1, 200});
  shared.rows.push_back({1, 37});
  shared.shared_prefix_blocks = 5;
  expect_close(shared);
}

TEST_F(MlaDecodeGpuTest, FlashMla656WideHeadsLongSegmentsOneSm) {
  // One SM: segments of many tiles on the 64-head-tile kernel (the staging
  // stages and their register-held scales reused many times; small enough
  // for racecheck).
  expect_close(flash(with_options(make_case("fp8-656 h128 1 sm", 128, 64, KvElement::kFP8E4M3, {700, 3}, 77), 0, 1)));
  expect_close(
      flash(with_options(make_case("fp8-656 h64 bs16 1 sm", 64, 16, KvElement::kFP8E4M3, {1000, 130}, 80), 0, 1)));
}

TEST_F(MlaDecodeGpuTest, FlashMla656AgainstTheBf16Pool) {
  // The same latent (same seed: the same values are drawn) stored as bf16, as
  // per-vector fp8 and as FlashMLA's records: the two fp8 outputs' distance from
  // the bf16 pool's output (what fp8 storage costs), at blocks of 64 / 16 / 1,
  // on the narrow (16 heads) and the 64-head-tile (128 heads) kernels.
  for (int32_t heads : {16, 128})
  for (int32_t bs : {64, 16, 1}) {
    const std::vector<int32_t> lengths{33, 700, 3000};
    const uint32_t seed = 60 + uint32_t(bs);
    auto output = [&](KvElement e, MlaLatentLayout layout) {
      MlaCase c = make_case("vs bf16", heads, bs, e, lengths, seed);
      c.layout = layout;
      const MlaBatch b = make_batch(c);
      auto got = run(b, c);
      EXPECT_TRUE(got.ok()) << got.status().message();
      std::vector<double> d;
      if (got.ok())
        for (uint16_t v : *got) d.push_back(bf16_to_f32(v));
      return std::make_pair(got.ok() ? *got : std::vector<uint16_t>{}, d);
    };
    const auto bf16 = output(KvElement::kBF16, MlaLatentLayout::kPerVectorScale);
    const auto vec = output(KvElement::kFP8E4M3, MlaLatentLayout::kPerVectorScale);
    const auto fl = output(KvElement::kFP8E4M3, MlaLatentLayout::kFlashMla656);
    ASSERT_FALSE(bf16.first.empty() || vec.first.empty() || fl.first.empty());
    const double vec_err = testing::relative_l2(vec.first, bf16.second);
    const double flash_err = testing::relative_l2(fl.first, bf16.second);
    std::printf("%3d heads, blocks of %2d: rel L2 to the bf16 pool's output: fp8 per-vector %.3e, "
                "fp8 FlashMLA 656 B %.3e\n", heads, bs, vec_err, flash_err);
    EXPECT_LT(flash_err, 0.05) << heads << " heads, blocks of " << bs;
    EXPECT_LT(flash_err, 1.1 * vec_err) << heads << " heads, blocks of " << bs;
  }
}

TEST_F(MlaDecodeGpuTest, RowsSharingBlocks) {
  // Prefill-style rows of one sequence (context_len = position + 1, one block
  // table), then rows of a fork that shares the first sequence's first blocks.
  MlaCase c = make_case("bf16 h16 prefill rows + fork", 16, 16, KvElement::kBF16, {300, 200}, 13);
  for (int32_t p = 250; p < 300; ++p) c.rows.push_back({0, p + 1});
  c.rows.push_back({1, 200});
  c.rows.push_back({1, 37});
  c.shared_prefix_blocks = 5;
  expect_close(c);
  MlaCase f = c;
  f.name = "fp8 h128 bs1 prefill rows + fork";
  f.heads = 128;
  f.block_size = 1;
  f.element = KvElement::kFP8E4M3;
  f.shared_prefix_blocks = 80;
  f.seed = 14;
  expect_close(f);
}

// ---- The TMA-fed 16-head bf16 kernel (MlaDecodeKernel::kTma, one tile's
// slots at two CTAs an SM kTmaPair, and the two with the whole-tile producer
// schedule, kTmaTile / kTmaPairTile; and kTmaPingPong, each compute warpgroup
// on its own tiles; kTmaFastExp, kTma with a shorter
// softmax; kTmaPingPongFastExp / kTmaPingPongTurns / kTmaPingPongTwoChains /
// kTmaPingPongAll; kTmaPingPongSplit / kTmaPingPongSplitTwoChains, whose
// groups' partials go through the merge pass; mla_decode_tma.cu), every case on all.
// Unused pool slots hold NaN, so the rows of a partial last page (and of pages
// past a segment's end) must be zeroed, not merely masked. run() fails a case
// whose plan did not take the kernel asked for.
MlaDecodeKernel tma_kernel = MlaDecodeKernel::kTma;  // the variant the TMA tests run (set by each test's loop)
constexpr MlaDecodeKernel kTmaKernels[] = {MlaDecodeKernel::kTma,         MlaDecodeKernel::kTmaTile,
                                           MlaDecodeKernel::kTmaPair,     MlaDecodeKernel::kTmaPairTile,
                                           MlaDecodeKernel::kTmaPingPong, MlaDecodeKernel::kTmaFastExp,
                                           MlaDecodeKernel::kTmaPingPongFastExp,
                                           MlaDecodeKernel::kTmaPingPongTurns,
                                           MlaDecodeKernel::kTmaPingPongTwoChains,
                                           MlaDecodeKernel::kTmaPingPongAll,
                                           MlaDecodeKernel::kTmaPingPongSplit,
                                           MlaDecodeKernel::kTmaPingPongSplitTwoChains};

MlaCase tma(MlaCase c) {
  c.options.kernel = tma_kernel;
  if (tma_kernel != MlaDecodeKernel::kTma) c.name += std::string(" ") + kernel_name(tma_kernel);
  c.poison_unused = true;
  return c;
}

TEST_F(MlaDecodeGpuTest, TmaBlockSizesRaggedEnds) {
  for (MlaDecodeKernel k : kTmaKernels) {
    tma_kernel = k;
    const KvElement bf16 = KvElement::kBF16;
    expect_close(tma(make_case("tma h16 bs64 ragged", 16, 64, bf16, {1, 63, 64, 65, 2000, 4100}, 90)));
    expect_close(tma(make_case("tma h16 bs16 ragged", 16, 16, bf16, {1, 17, 64, 65, 300, 1000, 4097}, 91)));
    expect_close(tma(make_case("tma h16 bs32", 16, 32, bf16, {5, 100, 777}, 92)));
    expect_close(tma(make_case("tma h16 bs8", 16, 8, bf16, {3, 100, 777}, 93)));
    expect_close(tma(make_case("tma h16 bs128", 16, 128, bf16, {5, 100, 130, 777}, 94)));
    expect_close(tma(make_case("tma h16 bs256", 16, 256, bf16, {200, 1000}, 95)));
    // Fewer heads (tensor-parallel ranks): Q rows past num_heads are zeros.
    expect_close(tma(make_case("tma h8 bs64", 8, 64, bf16, {1, 500}, 96)));
    expect_close(tma(make_case("tma h1 bs16", 1, 16, bf16, {64, 129}, 97)));
  }
}

TEST_F(MlaDecodeGpuTest, TmaSplitsSchedulesAndSharing) {
  for (MlaDecodeKernel k : kTmaKernels) {
    tma_kernel = k;
    const KvElement bf16 = KvElement::kBF16;
    // Fixed small splits (the merge pass), segments ending inside a page.
    expect_close(tma(with_options(make_case("tma h16 bs64 split 64", 16, 64, bf16, {1, 100, 1000, 2500}, 100), 64, 0)));
    expect_close(tma(with_options(make_case("tma h16 bs16 split 128", 16, 16, bf16, {7, 333, 1200}, 101), 100, 0)));
    // Few SMs: several segments per CTA, the stage ring carried across segments.
    expect_close(tma(with_options(
        make_case("tma h16 bs64 7 sms", 16, 64, bf16, {1, 5, 70, 300, 1000, 2000, 64, 3}, 102), 0, 7)));
    expect_close(tma(with_options(make_case("tma h16 bs16 5 sms", 16, 16, bf16, {129, 1, 2000, 40}, 103), 0, 5)));
    // One SM: long segments, both stages reused many times.
    expect_close(tma(with_options(make_case("tma h16 bs64 1 sm", 16, 64, bf16, {1000, 130}, 104), 0, 1)));
    expect_close(tma(with_options(make_case("tma h16 bs16 1 sm", 16, 16, bf16, {1000, 130}, 105), 0, 1)));
    // Prefill-style rows of one sequence and a fork sharing its first blocks.
    MlaCase shared = tma(make_case("tma h16 bs16 prefill rows + fork", 16, 16, bf16, {300, 200}, 106));
    for (int32_t p = 250; p < 300; ++p) shared.rows.push_back({0, p + 1});
    shared.rows.push_back({1, 200});
    shared.rows.push_back({1, 37});
    shared.shared_prefix_blocks = 5;
    expect_close(shared);
  }
}

TEST_F(MlaDecodeGpuTest, TmaGraphPlans) {
  for (MlaDecodeKernel k : kTmaKernels) {
    tma_kernel = k;
    // The CUDA-graph layout (fixed rows with padding, tables at a stride), launched
    // directly and through a captured graph (the tensor map is a kernel parameter).
    for (const bool graph : {false, true}) {
      MlaCase c = tma(make_case(graph ? "tma h16 bs64 fixed 8 graph" : "tma h16 bs64 fixed 8", 16, 64,
                                KvElement::kBF16, {1, 70, 3000, 640, 5}, 107));
      c.options.fixed_rows = 8;
      c.options.fixed_block_table_stride = 100;
      c.use_graph = graph;
      expect_close(c);
      MlaCase s = tma(make_case(graph ? "tma h16 bs16 fixed 4 graph" : "tma h16 bs16 fixed 4", 16, 16,
                                KvElement::kBF16, {2, 300, 1000}, 108));
      s.options.fixed_rows = 4;
      s.options.fixed_block_table_stride = 100;
      s.use_graph = graph;
      expect_close(s);
    }
  }
}

TEST_F(MlaDecodeGpuTest, ProgrammaticMergeMatchesPlainLaunch) {
  // The merge pass as a programmatic dependent launch reads the workspace only
  // after griddepcontrol.wait: the same bits as the plain launch, directly and
  // in a captured graph (a programmatic edge), for a kernel of each family.
  struct Kind {
    MlaDecodeKernel kernel;
    KvElement element;
    MlaLatentLayout layout;
  };
  const Kind kinds[] = {{MlaDecodeKernel::kCpAsync, KvElement::kBF16, MlaLatentLayout::kPerVectorScale},
                        {MlaDecodeKernel::kTma, KvElement::kBF16, MlaLatentLayout::kPerVectorScale},
                        {MlaDecodeKernel::kTmaPingPong, KvElement::kBF16, MlaLatentLayout::kPerVectorScale},
                        {MlaDecodeKernel::kTmaFp8, KvElement::kFP8E4M3, MlaLatentLayout::kFlashMla656}};
  for (const Kind& kind : kinds) {
    for (const bool graph : {false, true}) {
      MlaCase c = with_options(make_case("pdl merge", 16, 64, kind.element, {1, 100, 1000, 2500, 640}, 120), 64, 0);
      c.layout = kind.layout;
      c.options.kernel = kind.kernel;
      c.options.merge = MlaMergeMode::kPass;  // the pass is what launches programmatically
      c.use_graph = graph;
      const MlaBatch b = make_batch(c);
      auto plain = run(b, c);
      ASSERT_TRUE(plain.ok()) << plain.status().message();
      c.programmatic_merge = true;
      auto pdl = run(b, c);
      ASSERT_TRUE(pdl.ok()) << pdl.status().message();
      EXPECT_TRUE(*pdl == *plain) << kernel_name(kind.kernel) << (graph ? " graph" : " direct");
    }
  }
}

TEST_F(MlaDecodeGpuTest, TmaMatchesCpAsyncKernel) {
  // The same math in the same order on every kernel but the ping-pong ones and
  // kTmaFastExp: the other TMA variants differ only in how the tiles are
  // loaded, so they must agree bit for bit; against cp.async the outputs agree
  // to far below bf16's rounding (printed). The rows are short enough (59
  // tiles) that every plan, the pair variants' wave of 2 x num_sms CTAs
  // included, cuts them into the same segments.
  for (int32_t bs : {64, 16}) {
    MlaCase c = make_case("tma vs cp.async", 16, bs, KvElement::kBF16, {33, 700, 3000}, 110 + uint32_t(bs));
    const MlaBatch b = make_batch(c);
    c.options.kernel = MlaDecodeKernel::kCpAsync;
    auto old_out = run(b, c);
    ASSERT_TRUE(old_out.ok()) << old_out.status().message();
    std::vector<double> want;
    for (uint16_t v : *old_out) want.push_back(bf16_to_f32(v));
    std::vector<uint16_t> first_tma, pingpong;
    for (MlaDecodeKernel k : kTmaKernels) {
      c.options.kernel = k;
      auto new_out = run(b, c);
      ASSERT_TRUE(new_out.ok()) << new_out.status().message();
      const double err = testing::relative_l2(*new_out, want);
      size_t differing = 0;
      for (size_t i = 0; i < want.size(); ++i) differing += (*old_out)[i] != (*new_out)[i];
      std::printf("blocks of %2d: %s vs cp.async rel L2 %.3e, %zu of %zu outputs differ\n", bs, kernel_name(k), err,
                  differing, want.size());
      EXPECT_LT(err, 1e-3) << "blocks of " << bs;
      // The ping-pong kernels sum S^T in one chain and combine two partial O^T,
      // kTmaFastExp rounds its exponents differently: other
      // roundings, so only the bound above applies to it.
      // kTmaPingPongTurns does kTmaPingPong's arithmetic in its order (another
      // issue order between the groups): its bits.
      if (k == MlaDecodeKernel::kTmaPingPong) pingpong = *new_out;
      if (k == MlaDecodeKernel::kTmaPingPongTurns) {
        EXPECT_TRUE(*new_out == pingpong) << kernel_name(k) << " differs from tma_pingpong, blocks of " << bs;
      }
      if (k == MlaDecodeKernel::kTmaPingPong || k == MlaDecodeKernel::kTmaFastExp ||
          k == MlaDecodeKernel::kTmaPingPongFastExp ||
          k == MlaDecodeKernel::kTmaPingPongTurns || k == MlaDecodeKernel::kTmaPingPongTwoChains ||
          k == MlaDecodeKernel::kTmaPingPongAll || k == MlaDecodeKernel::kTmaPingPongSplit ||
          k == MlaDecodeKernel::kTmaPingPongSplitTwoChains)
        continue;
      if (first_tma.empty()) first_tma = *new_out;
      else EXPECT_TRUE(*new_out == first_tma) << kernel_name(k) << " differs from tma, blocks of " << bs;
    }
  }
}

TEST_F(MlaDecodeGpuTest, TmaOccupancy) {
  // The pair variants exist to run two CTAs an SM (one CTA's loads and barriers
  // overlapping the other's MMAs): the occupancy calculator must agree.
  for (MlaDecodeKernel k : kTmaKernels) {
    int ctas = 0;
    ASSERT_EQ(mla_decode_tma_occupancy(k, &ctas), cudaSuccess) << kernel_name(k);
    std::printf("%-14s %d CTA(s) per SM\n", kernel_name(k), ctas);
    EXPECT_EQ(ctas, mla_decode_ctas_per_sm(k)) << kernel_name(k);
  }
  int ctas = 0;
  EXPECT_EQ(mla_decode_tma_occupancy(MlaDecodeKernel::kCpAsync, &ctas), cudaErrorInvalidValue);
}

// The ping-pong kernels alone on small shapes, sized for compute-sanitizer racecheck
// and synccheck (tools/gpu/mla_decode_call.sh): 2 SMs so that a CTA runs several
// segments (the stages reused across segments, the groups' hand-over or
// per-group records at each end), a one-tile segment (one group has no tile:
// its state must weigh nothing), a split row through the merge pass, a ragged
// end at blocks of 16; with `fixed`, also a fixed (graph-shaped) plan with
// padding rows (the merge pass zeroes them).
void pingpong_small(MlaDecodeKernel k, bool fixed) {
  tma_kernel = k;
  const KvElement bf16 = KvElement::kBF16;
  expect_close(tma(with_options(make_case("tma h16 bs64 2 sms", 16, 64, bf16, {1, 64, 65, 300, 700}, 130), 0, 2)));
  expect_close(tma(with_options(make_case("tma h16 bs64 split 128", 16, 64, bf16, {5, 500}, 131), 128, 0)));
  expect_close(tma(with_options(make_case("tma h16 bs16 2 sms", 16, 16, bf16, {17, 129, 250}, 132), 0, 2)));
  if (!fixed) return;
  MlaCase g = tma(with_options(make_case("tma h16 bs64 fixed 6 2 sms", 16, 64, bf16, {1, 130, 700}, 133), 0, 2));
  g.options.fixed_rows = 6;
  g.options.fixed_block_table_stride = 16;
  expect_close(g);
}

TEST_F(MlaDecodeGpuTest, TmaPingPongSmall) {
  // The ping-pong kernels with the shared-memory hand-over at a segment's end.
  for (MlaDecodeKernel k : {MlaDecodeKernel::kTmaPingPong, MlaDecodeKernel::kTmaPingPongFastExp,
                            MlaDecodeKernel::kTmaPingPongTurns,
                            MlaDecodeKernel::kTmaPingPongTwoChains, MlaDecodeKernel::kTmaPingPongAll})
    pingpong_small(k, false);
}

TEST_F(MlaDecodeGpuTest, TmaPingPongSplitSmall) {
  // kTmaPingPongSplit and kTmaPingPongSplitTwoChains alone (their own filter,
  // so the sanitizers' verdict on them is not mixed with the hand-over
  // kernels'): no shared memory passes between their groups but Q; each group
  // writes a workspace record.
  pingpong_small(MlaDecodeKernel::kTmaPingPongSplit, true);
  pingpong_small(MlaDecodeKernel::kTmaPingPongSplitTwoChains, true);
}

TEST_F(MlaDecodeGpuTest, SpreadBudgetPlans) {
  // MlaDecodeOptions::spread_budget: every SM gets a CTA (rows cut at other
  // places than with whole budgets), on cp.async and every TMA variant.
  const KvElement bf16 = KvElement::kBF16;
  std::vector<MlaDecodeKernel> kernels{MlaDecodeKernel::kCpAsync};
  kernels.insert(kernels.end(), std::begin(kTmaKernels), std::end(kTmaKernels));
  for (MlaDecodeKernel k : kernels) {
    tma_kernel = k;
    auto spread = [&](MlaCase c) {
      c.options.spread_budget = true;
      c.name += " spread";
      if (k == MlaDecodeKernel::kCpAsync) {
        c.options.kernel = k;
        c.name += " cp.async";
        return c;
      }
      return tma(c);
    };
    // Rows of 4K (cut mid-row), ragged rows, few SMs, a graph plan.
    expect_close(spread(make_case("h16 bs64 8x4K", 16, 64, bf16, std::vector<int32_t>(8, 4096), 120)));
    expect_close(spread(make_case("h16 bs16 ragged", 16, 16, bf16, {1, 17, 64, 65, 300, 1000, 4097}, 121)));
    expect_close(
        spread(with_options(make_case("h16 bs64 7 sms", 16, 64, bf16, {1, 5, 70, 300, 1000, 2000, 3}, 122), 0, 7)));
    MlaCase g = spread(make_case("h16 bs64 fixed 8 graph", 16, 64, bf16, {1, 70, 3000, 640, 5}, 123));
    g.options.fixed_rows = 8;
    g.options.fixed_block_table_stride = 100;
    g.use_graph = true;
    expect_close(g);
  }
}

// ---- kTmaFp8: FlashMLA's 656-byte fp8 records loaded raw by bulk copies and
// dequantized in shared memory (mla_decode_tma_fp8.cu). Unused pool records
// hold NaN codes, scales and rope values, so rows past a segment's end must be
// zeroed, not merely masked. run() fails a case whose plan did not take kTmaFp8.
MlaCase tma_fp8(MlaCase c) {
  c.layout = MlaLatentLayout::kFlashMla656;
  c.options.kernel = MlaDecodeKernel::kTmaFp8;
  c.name += " tma_fp8";
  c.poison_unused = true;
  return c;
}

TEST_F(MlaDecodeGpuTest, TmaFp8BlockSizesRaggedEnds) {
  const KvElement fp8 = KvElement::kFP8E4M3;
  expect_close(tma_fp8(make_case("fp8-656 h16 bs64 ragged", 16, 64, fp8, {1, 63, 64, 65, 2000, 4100}, 140)));
  expect_close(tma_fp8(make_case("fp8-656 h16 bs16 ragged", 16, 16, fp8, {1, 17, 64, 65, 300, 1000, 4097}, 141)));
  expect_close(tma_fp8(make_case("fp8-656 h16 bs32", 16, 32, fp8, {5, 100, 777}, 142)));
  expect_close(tma_fp8(make_case("fp8-656 h16 bs8", 16, 8, fp8, {3, 100, 777}, 143)));
  expect_close(tma_fp8(make_case("fp8-656 h16 bs1", 16, 1, fp8, {1, 2, 100, 333}, 144)));
  expect_close(tma_fp8(make_case("fp8-656 h16 bs48", 16, 48, fp8, {7, 200, 1001}, 145)));
  expect_close(tma_fp8(make_case("fp8-656 h16 bs128", 16, 128, fp8, {5, 100, 130, 777}, 146)));
  expect_close(tma_fp8(make_case("fp8-656 h8 bs64", 8, 64, fp8, {1, 500}, 147)));
  expect_close(tma_fp8(make_case("fp8-656 h1 bs16", 1, 16, fp8, {64, 129}, 148)));
}

TEST_F(MlaDecodeGpuTest, TmaFp8SplitsSchedulesAndSharing) {
  const KvElement fp8 = KvElement::kFP8E4M3;
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs64 split 64", 16, 64, fp8, {1, 100, 1000, 2500}, 150), 64, 0)));
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs16 split 128", 16, 16, fp8, {7, 333, 1200}, 151), 100, 0)));
  expect_close(tma_fp8(
      with_options(make_case("fp8-656 h16 bs64 7 sms", 16, 64, fp8, {1, 5, 70, 300, 1000, 2000, 64, 3}, 152), 0, 7)));
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs16 5 sms", 16, 16, fp8, {129, 1, 2000, 40}, 153), 0, 5)));
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs64 1 sm", 16, 64, fp8, {1000, 130}, 154), 0, 1)));
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs16 1 sm", 16, 16, fp8, {1000, 131}, 155), 0, 1)));
  MlaCase spread = tma_fp8(make_case("fp8-656 h16 bs64 8x4K spread", 16, 64, fp8, std::vector<int32_t>(8, 4096), 156));
  spread.options.spread_budget = true;
  expect_close(spread);
  MlaCase shared = tma_fp8(make_case("fp8-656 h16 bs16 prefill rows + fork", 16, 16, fp8, {300, 200}, 157));
  for (int32_t p = 250; p < 300; ++p) shared.rows.push_back({0, p + 1});
  shared.rows.push_back({1, 200});
  shared.rows.push_back({1, 37});
  shared.shared_prefix_blocks = 5;
  expect_close(shared);
  for (const bool graph : {false, true}) {
    MlaCase c = tma_fp8(make_case(graph ? "fp8-656 h16 bs64 fixed 8 graph" : "fp8-656 h16 bs64 fixed 8", 16, 64, fp8,
                                  {1, 70, 3000, 640, 5}, 158));
    c.options.fixed_rows = 8;
    c.options.fixed_block_table_stride = 100;
    c.use_graph = graph;
    expect_close(c);
  }
}

TEST_F(MlaDecodeGpuTest, TmaFp8MatchesCpAsyncKernel) {
  // The same bf16 tile values as the cp.async kernel's conversion, another
  // summation order (kTmaPingPongTwoChains'): close, not bit-equal (printed).
  for (int32_t bs : {64, 16}) {
    MlaCase c = make_case("tma_fp8 vs cp.async", 16, bs, KvElement::kFP8E4M3, {33, 700, 3000}, 160 + uint32_t(bs));
    c.layout = MlaLatentLayout::kFlashMla656;
    const MlaBatch b = make_batch(c);
    c.options.kernel = MlaDecodeKernel::kCpAsync;
    auto old_out = run(b, c);
    ASSERT_TRUE(old_out.ok()) << old_out.status().message();
    c.options.kernel = MlaDecodeKernel::kTmaFp8;
    auto new_out = run(b, c);
    ASSERT_TRUE(new_out.ok()) << new_out.status().message();
    std::vector<double> want;
    for (uint16_t v : *old_out) want.push_back(bf16_to_f32(v));
    const double err = testing::relative_l2(*new_out, want);
    size_t differing = 0;
    for (size_t i = 0; i < want.size(); ++i) differing += (*old_out)[i] != (*new_out)[i];
    std::printf("blocks of %2d: tma_fp8 vs cp.async rel L2 %.3e, %zu of %zu outputs differ\n", bs, err, differing,
                want.size());
    EXPECT_LT(err, 1e-3) << "blocks of " << bs;
  }
  int ctas = 0;
  ASSERT_EQ(mla_decode_tma_fp8_occupancy(&ctas), cudaSuccess);
  std::printf("tma_fp8 %d CTA(s) per SM\n", ctas);
  EXPECT_EQ(ctas, 1);
}

// Small shapes for compute-sanitizer racecheck / synccheck: 2 SMs (several
// segments a CTA: the staging ring and the hand-over reused), a one-tile
// segment, a split row through the merge pass, ragged ends at blocks of 16,
// a fixed plan with padding rows.
TEST_F(MlaDecodeGpuTest, TmaFp8Small) {
  const KvElement fp8 = KvElement::kFP8E4M3;
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs64 2 sms", 16, 64, fp8, {1, 64, 65, 300, 700}, 170), 0, 2)));
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs64 split 128", 16, 64, fp8, {5, 500}, 171), 128, 0)));
  expect_close(tma_fp8(with_options(make_case("fp8-656 h16 bs16 2 sms", 16, 16, fp8, {17, 129, 250}, 172), 0, 2)));
  MlaCase g = tma_fp8(with_options(make_case("fp8-656 h16 bs64 fixed 6 2 sms", 16, 64, fp8, {1, 130, 700}, 173), 0, 2));
  g.options.fixed_rows = 6;
  g.options.fixed_block_table_stride = 16;
  expect_close(g);
}

// Engine scale, where the automatic kTmaFp8 once failed (docs/BENCHMARKS.md "MLA decode v16": an
// intermittent CUDA error 719 in a V2-Lite run of 512 sequences, none in the tests above): 256 rows of
// 900-1,300 positions on the whole GPU, blocks of 16 scattered over the pool, launched 27 x 20 times
// back to back on one stream as a model's layers and steps would; every launch must succeed, every
// step's output must be the first's bit for bit, and the output must stay within the float64 bound of
// the cp.async kernel's (each is within it of float64; the two differ by 1.9e-3 to 2.1e-3 here, more
// than at the short rows of TmaFp8MatchesCpAsyncKernel). It has not reproduced the engine's fault
// (H200, 2026-12-04: 3 processes, 0 errors under memcheck).
TEST_F(MlaDecodeGpuTest, TmaFp8EngineScaleBackToBack) {
  std::mt19937 lengths_rng(181);
  std::uniform_int_distribution<int32_t> length(900, 1300);
  std::vector<int32_t> lengths(256);
  for (int32_t& n : lengths) n = length(lengths_rng);
  MlaCase c = make_case("fp8-656 h16 bs16 engine scale", 16, 16, KvElement::kFP8E4M3, lengths, 182);
  c.layout = MlaLatentLayout::kFlashMla656;
  const MlaBatch b = make_batch(c);
  c.options.kernel = MlaDecodeKernel::kCpAsync;
  auto want = run(b, c);
  ASSERT_TRUE(want.ok()) << want.status().message();

  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  std::vector<MlaDecodeRow> rows;
  for (const auto& r : b.rows) rows.push_back({r.context_len, b.tables[size_t(r.sequence)]});
  c.options.kernel = MlaDecodeKernel::kTmaFp8;
  auto plan = MlaDecodePlan::create(b.config, rows, AttentionDeviceInfo{prop.multiProcessorCount}, c.options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->kernel(), MlaDecodeKernel::kTmaFp8);
  const size_t out_elements = b.rows.size() * size_t(b.config.num_heads) * kMlaLatentDim;
  DeviceBuffer codes(b.codes.size()), q(b.q.size() * 2), out(out_elements * 2), arena(plan->arena_bytes()),
      workspace(plan->workspace_bytes());
  for (auto* buf : {&codes, &q, &out, &arena, &workspace}) ASSERT_TRUE(buf->ok()) << buf->bytes();
  ASSERT_EQ(cudaMemcpy(codes.get(), b.codes.data(), b.codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(q.get(), b.q.data(), b.q.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(arena.get(), plan->arena().data(), plan->arena_bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  const auto desc = plan->descriptor(arena.get<int32_t>(), codes.get(), nullptr, workspace.get<float>());
  std::vector<uint16_t> first(out_elements), got(out_elements);
  size_t runs_differing = 0;
  for (int step = 0; step < 20; ++step) {
    for (int layer = 0; layer < 27; ++layer)
      ASSERT_EQ(launch_mla_decode(desc, q.get(), out.get(), nullptr), cudaSuccess) << step << " " << layer;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "step " << step;
    // The same inputs and plan: every step's output must be the first's, bit for bit.
    ASSERT_EQ(cudaMemcpy(got.data(), out.get(), out_elements * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    if (step == 0) first = got;
    else runs_differing += got != first;
  }
  std::printf("engine scale: %zu of 19 steps' outputs differ from the first's\n", runs_differing);
  EXPECT_EQ(runs_differing, 0u) << "tma_fp8 is not deterministic at this scale (a race)";
  std::vector<double> reference;
  for (uint16_t v : *want) reference.push_back(bf16_to_f32(v));
  const double err = testing::relative_l2(got, reference);
  std::printf("engine scale: %zu rows, %d segments, tma_fp8 vs cp.async rel L2 %.3e after 540 launches\n",
              b.rows.size(), plan->descriptor(nullptr, nullptr, nullptr, nullptr).num_segments, err);
  EXPECT_LT(err, kMaxRelativeError);
}

// Swizzled bf16 pages (runtime/mla_latent_layout.h): the cp.async kernels load the same values into the same
// tiles from other addresses, so their outputs equal the token-major pool's bit for bit: narrow and wide head
// tiles, pages of 8 / 16 / 64 / 128 positions, ragged ends over NaN-poisoned unused rows, forced splits, rows
// sharing blocks, a graph-captured fixed plan. Also against the float64 reference. A TMA request falls back to
// cp.async (its boxes read token-major rows), and a swizzled descriptor is refused for fp8 or other pages.
TEST_F(MlaDecodeGpuTest, SwizzledPagesGiveTheTokenMajorBits) {
  struct Variant {
    const char* name;
    int32_t heads, block_size, split_tokens;
    bool graph;
  };
  for (const Variant& v : {Variant{"h16 bs16", 16, 16, 0, false}, Variant{"h16 bs8 splits", 16, 8, 128, false},
                           Variant{"h16 bs64", 16, 64, 0, false}, Variant{"h16 bs128 graph", 16, 128, 0, true},
                           Variant{"h128 bs64", 128, 64, 0, false}, Variant{"h128 bs16 splits", 128, 16, 192, false},
                           Variant{"h20 bs24", 20, 24, 0, false}}) {
    MlaCase c = make_case(std::string("swizzled ") + v.name, v.heads, v.block_size, KvElement::kBF16,
                          {1, 7, 64, 65, 301, 1500}, 300 + uint32_t(v.block_size));
    c.poison_unused = true;
    c.shared_prefix_blocks = 1;  // sequence 1's first page is sequence 0's
    c.rows = {{0, 1}, {1, 7}, {1, 5}, {2, 64}, {3, 65}, {4, 301}, {5, 1500}, {5, 1499}};
    c.options.kernel = MlaDecodeKernel::kCpAsync;
    c.options.split_tokens = v.split_tokens;
    if (v.graph) {
      c.options.fixed_rows = 12;
      c.options.fixed_block_table_stride = 1600 / v.block_size + 1;
      c.use_graph = true;
    }
    auto token_major = run(make_batch(c), c);
    ASSERT_TRUE(token_major.ok()) << c.name << ": " << token_major.status().message();
    c.layout = MlaLatentLayout::kBf16SwizzledPages;
    const MlaBatch b = make_batch(c);
    MlaDecodePlan plan = MlaDecodePlan::create(b.config, {}).value();
    auto swizzled = run(b, c, &plan);
    ASSERT_TRUE(swizzled.ok()) << c.name << ": " << swizzled.status().message();
    size_t differing = 0;
    for (size_t i = 0; i < token_major->size(); ++i) differing += (*token_major)[i] != (*swizzled)[i];
    EXPECT_EQ(differing, 0u) << c.name << ": outputs differ from the token-major pool's";
    if (!v.graph) expect_close(c);
    // A tensor-map kernel asked for plans cp.async over swizzled pages (the boxes would read token-major rows);
    // the automatic choice, where the environment leaves it, takes the bulk-copy kernel at <= 16 heads and
    // pages of a multiple of 64, else cp.async.
    std::vector<MlaDecodeRow> rows;
    for (const auto& r : b.rows) rows.push_back({r.context_len, b.tables[size_t(r.sequence)]});
    const char* env = std::getenv("PAGODA_MLA_DECODE_KERNEL");
    for (MlaDecodeKernel k : {MlaDecodeKernel::kTmaPingPongTwoChains, MlaDecodeKernel::kTma, MlaDecodeKernel::kDefault}) {
      if (k == MlaDecodeKernel::kDefault && env != nullptr && *env != '\0') continue;
      MlaDecodeOptions o = c.options;
      o.kernel = k;
      auto fallback = MlaDecodePlan::create(b.config, rows, AttentionDeviceInfo{8}, o);
      ASSERT_TRUE(fallback.ok()) << c.name << ": " << fallback.status().message();
      const MlaDecodeKernel expected = k == MlaDecodeKernel::kDefault && v.heads <= 16 && v.block_size % 64 == 0
                                           ? MlaDecodeKernel::kBulkPingPongTwoChains
                                           : MlaDecodeKernel::kCpAsync;
      EXPECT_EQ(fallback->kernel(), expected) << c.name << ", kernel " << static_cast<int>(k);
    }
  }
  // A swizzled descriptor the kernels cannot read is refused at launch.
  MlaCase c = make_case("swizzled refused", 16, 16, KvElement::kBF16, {10}, 16);
  const MlaBatch b = make_batch(c);
  std::vector<MlaDecodeRow> rows{{10, b.tables[0]}};
  auto desc = MlaDecodePlan::create(b.config, rows)->descriptor(nullptr, nullptr, nullptr, nullptr);
  desc.latent_layout = MlaLatentLayout::kBf16SwizzledPages;
  desc.block_size = 12;
  EXPECT_EQ(launch_mla_decode(desc, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  desc.block_size = 16;
  desc.latent_element = KvElement::kFP8E4M3;
  const float scales[1] = {1.0f};
  desc.latent_scale = scales;  // so only the layout is wrong
  EXPECT_EQ(launch_mla_decode(desc, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

// kBulkPingPongTwoChains (1-D bulk copies of swizzled pages) loads the tiles kTmaPingPongTwoChains' boxes
// load from the token-major copy of the same pool, and computes the same way: the same output bits. Pages of
// 64 / 128 / 256 (a piece of a page per tile) and 8 / 16 / 32 (several pages a tile), ragged ends over
// NaN-poisoned unused rows, forced splits, few SMs (segments carried across the ring), prefill-style rows and
// a fork sharing blocks, fewer heads, a fixed plan launched directly and from a graph; and against float64.
TEST_F(MlaDecodeGpuTest, BulkKernelOnSwizzledPagesGivesThePingPongBits) {
  const KvElement bf16 = KvElement::kBF16;
  std::vector<MlaCase> cases = {
      make_case("bulk h16 bs64 ragged", 16, 64, bf16, {1, 63, 64, 65, 2000, 4100}, 190),
      make_case("bulk h16 bs128", 16, 128, bf16, {5, 100, 130, 777}, 191),
      make_case("bulk h16 bs256", 16, 256, bf16, {200, 1000}, 192),
      make_case("bulk h16 bs16 ragged", 16, 16, bf16, {1, 17, 64, 65, 300, 1000, 4097}, 193),
      make_case("bulk h16 bs32", 16, 32, bf16, {5, 100, 777}, 194),
      make_case("bulk h16 bs8", 16, 8, bf16, {3, 100, 777}, 195),
      make_case("bulk h8 bs64", 8, 64, bf16, {1, 500}, 196),
      with_options(make_case("bulk h16 bs64 split 64", 16, 64, bf16, {1, 100, 1000, 2500}, 197), 64, 0),
      with_options(make_case("bulk h16 bs16 7 sms", 16, 16, bf16, {1, 5, 70, 300, 1000, 2000, 64, 3}, 198), 0, 7),
      with_options(make_case("bulk h16 bs64 1 sm", 16, 64, bf16, {1000, 130}, 199), 0, 1)};
  MlaCase shared = make_case("bulk h16 bs16 prefill rows + fork", 16, 16, bf16, {300, 200}, 200);
  for (int32_t p = 250; p < 300; ++p) shared.rows.push_back({0, p + 1});
  shared.rows.push_back({1, 200});
  shared.rows.push_back({1, 37});
  shared.shared_prefix_blocks = 5;
  cases.push_back(shared);
  for (const bool graph : {false, true}) {
    MlaCase c = make_case(graph ? "bulk h16 bs64 fixed 8 graph" : "bulk h16 bs64 fixed 8", 16, 64, bf16,
                          {1, 70, 3000, 640, 5}, 201);
    c.options.fixed_rows = 8;
    c.options.fixed_block_table_stride = 100;
    c.use_graph = graph;
    cases.push_back(c);
  }
  for (MlaCase c : cases) {
    c.poison_unused = true;
    c.options.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
    auto tma_out = run(make_batch(c), c);
    ASSERT_TRUE(tma_out.ok()) << c.name << ": " << tma_out.status().message();
    c.layout = MlaLatentLayout::kBf16SwizzledPages;
    c.options.kernel = MlaDecodeKernel::kBulkPingPongTwoChains;
    auto bulk_out = run(make_batch(c), c);
    ASSERT_TRUE(bulk_out.ok()) << c.name << ": " << bulk_out.status().message();
    size_t differing = 0;
    for (size_t i = 0; i < tma_out->size(); ++i) differing += (*tma_out)[i] != (*bulk_out)[i];
    EXPECT_EQ(differing, 0u) << c.name << ": bulk_pingpong_2chain differs from tma_pingpong_2chain";
    expect_close(c);
  }
  // Outside its domain the plan takes cp.async: pages of 24 or 48, more than 16 heads, token-major pages.
  for (const auto& [heads, bs, layout] :
       {std::tuple{16, 24, MlaLatentLayout::kBf16SwizzledPages}, std::tuple{16, 48, MlaLatentLayout::kBf16SwizzledPages},
        std::tuple{20, 64, MlaLatentLayout::kBf16SwizzledPages}, std::tuple{16, 64, MlaLatentLayout::kPerVectorScale}}) {
    MlaCase c = make_case("bulk outside", heads, bs, bf16, {100, 300}, 202);
    c.layout = layout;
    MlaDecodeOptions o;
    o.kernel = MlaDecodeKernel::kBulkPingPongTwoChains;
    const MlaBatch b = make_batch(c);
    std::vector<MlaDecodeRow> rows;
    for (const auto& r : b.rows) rows.push_back({r.context_len, b.tables[size_t(r.sequence)]});
    auto plan = MlaDecodePlan::create(b.config, rows, AttentionDeviceInfo{8}, o);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    EXPECT_EQ(plan->kernel(), MlaDecodeKernel::kCpAsync) << heads << " heads, pages of " << bs;
  }
}

// The merge folded into the ping-pong kernels (MlaMergeMode::kFused, mla_decode_merge.cuh) combines the same
// records with the merge pass's arithmetic: the same output bits, for the automatic TMA kernel, the bulk kernel
// on swizzled pages, the plain ping-pong kernels and tma_fp8 on FlashMLA's records; rows split in 2 to 40 segments, CTAs holding several
// segments (7 SMs), launches back to back (the counters return to zero), fixed plans with padding rows (zeroed
// by the kernel) launched directly and replayed from a graph. The arena's counters are read back: all zero.
TEST_F(MlaDecodeGpuTest, FusedMergeGivesTheMergePassBits) {
  struct Kind {
    MlaDecodeKernel kernel;
    MlaLatentLayout layout;
    KvElement element;
  };
  const Kind kinds[] = {
      {MlaDecodeKernel::kTmaPingPongTwoChains, MlaLatentLayout::kPerVectorScale, KvElement::kBF16},
      {MlaDecodeKernel::kBulkPingPongTwoChains, MlaLatentLayout::kBf16SwizzledPages, KvElement::kBF16},
      {MlaDecodeKernel::kTmaPingPong, MlaLatentLayout::kPerVectorScale, KvElement::kBF16},
      {MlaDecodeKernel::kTmaPingPongAll, MlaLatentLayout::kPerVectorScale, KvElement::kBF16},
      {MlaDecodeKernel::kTmaFp8, MlaLatentLayout::kFlashMla656, KvElement::kFP8E4M3}};
  for (const Kind& kind : kinds) {
    const KvElement element = kind.element;
    std::vector<MlaCase> cases = {
        with_options(make_case("fused split 64", 16, 64, element, {1, 100, 1000, 2500}, 210), 64, 0),
        make_case("fused automatic", 16, 64, element, {4000, 3000, 70, 9000, 129}, 211),
        make_case("fused automatic bs16", 16, 16, element, {1, 17, 4097, 300, 6000}, 212),
        with_options(make_case("fused 7 sms", 16, 64, element, {1, 5, 70, 300, 1000, 2000, 64, 3}, 213), 0, 7),
        make_case("fused h8", 8, 64, element, {5000, 640}, 214),
        // Rows cut in two halves on neighbouring CTAs: every kernel here folds these by cluster pairs
        // (MlaDecodePlan::paired_merge). Pages of 64 and of 16, fewer heads.
        with_options(make_case("fused pairs 8 x 4K", 16, 64, element, {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096},
                               218),
                     0, 16),
        with_options(make_case("fused pairs bs16 ragged", 16, 16, element, {2900, 2900, 2900}, 219), 0, 6),
        with_options(make_case("fused pairs h8", 8, 64, element, {2048, 2048}, 220), 0, 4)};
    for (const bool graph : {false, true}) {
      MlaCase f =
          make_case(graph ? "fused fixed 8 graph" : "fused fixed 8", 16, 64, element, {1, 70, 3000, 640, 5}, 215);
      f.options.fixed_rows = 8;
      f.options.fixed_block_table_stride = 100;
      f.use_graph = graph;
      cases.push_back(f);
    }
    for (MlaCase c : cases) {
      c.name += std::string(" ") + kernel_name(kind.kernel);
      c.layout = kind.layout;
      c.poison_unused = true;
      c.options.kernel = kind.kernel;
      c.options.merge = MlaMergeMode::kPass;
      const MlaBatch b = make_batch(c);
      MlaDecodePlan pass_plan = MlaDecodePlan::create(b.config, {}).value();
      auto pass = run(b, c, &pass_plan);
      ASSERT_TRUE(pass.ok()) << c.name << ": " << pass.status().message();
      EXPECT_FALSE(pass_plan.fused_merge()) << c.name;
      c.options.merge = MlaMergeMode::kFused;
      c.launches = 3;
      MlaDecodePlan fused_plan = MlaDecodePlan::create(b.config, {}).value();
      auto fused = run(b, c, &fused_plan);
      ASSERT_TRUE(fused.ok()) << c.name << ": " << fused.status().message();
      EXPECT_TRUE(fused_plan.fused_merge()) << c.name << ": max_splits " << fused_plan.max_splits();
      const bool pairs = c.name.find("pairs") != std::string::npos;
      EXPECT_EQ(fused_plan.paired_merge(), pairs && mla_decode_can_pair_merge(kind.kernel)) << c.name;
      size_t differing = 0;
      for (size_t i = 0; i < pass->size(); ++i) differing += (*pass)[i] != (*fused)[i];
      EXPECT_EQ(differing, 0u) << c.name << ": the folded merge differs from the merge pass";
      std::printf("%-48s segments %4d ctas %4d max_splits %3d%s  fused == pass: %s\n", c.name.c_str(),
                  fused_plan.num_segments(), fused_plan.num_ctas(), fused_plan.max_splits(),
                  fused_plan.paired_merge() ? " paired" : "", differing == 0 ? "yes" : "NO");
      if (!pairs || !fused_plan.paired_merge()) continue;
      // The same rows folded through the counters (kFusedGlobal): the same bits again.
      c.options.merge = MlaMergeMode::kFusedGlobal;
      MlaDecodePlan global_plan = MlaDecodePlan::create(b.config, {}).value();
      auto global = run(b, c, &global_plan);
      ASSERT_TRUE(global.ok()) << c.name << ": " << global.status().message();
      EXPECT_TRUE(global_plan.fused_merge() && !global_plan.paired_merge()) << c.name;
      EXPECT_TRUE(*global == *pass) << c.name << ": the counters' folded merge differs from the merge pass";
    }
  }
}

// A bf16 tma_pingpong_2chain case with the merge folded, planned for `sms` SMs, its inputs and the plan's
// arena on the device, for the tests below that launch its descriptor themselves.
struct FusedLaunch {
  MlaBatch batch;
  std::optional<MlaDecodePlan> plan;
  DeviceBuffer codes, q, out, arena, workspace;
  MlaDecodeDescriptor desc{};
};

void prepare_fused_launch(const char* name, std::vector<int32_t> contexts, uint32_t seed, int sms, FusedLaunch* f) {
  MlaCase c = make_case(name, 16, 64, KvElement::kBF16, std::move(contexts), seed);
  c.options.kernel = MlaDecodeKernel::kTmaPingPongTwoChains;
  c.options.merge = MlaMergeMode::kFused;
  f->batch = make_batch(c);
  const MlaBatch& b = f->batch;
  std::vector<MlaDecodeRow> rows;
  for (const auto& r : b.rows) rows.push_back({r.context_len, b.tables[size_t(r.sequence)]});
  auto plan = MlaDecodePlan::create(b.config, rows, AttentionDeviceInfo{sms}, c.options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(plan->fused_merge());
  f->plan = std::move(*plan);
  f->codes = DeviceBuffer(b.codes.size());
  f->q = DeviceBuffer(b.q.size() * 2);
  f->out = DeviceBuffer(b.rows.size() * 16 * kMlaLatentDim * 2);
  f->arena = DeviceBuffer(f->plan->arena_bytes());
  f->workspace = DeviceBuffer(f->plan->workspace_bytes());
  ASSERT_EQ(cudaMemcpy(f->codes.get(), b.codes.data(), b.codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(f->q.get(), b.q.data(), b.q.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(f->arena.get(), f->plan->arena().data(), f->plan->arena_bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  f->desc = f->plan->descriptor(f->arena.get<int32_t>(), f->codes.get(), nullptr, f->workspace.get<float>());
}

int device_sms() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.multiProcessorCount : 0;
}

// The folded merge's counters, read back from the device after launches: zero again after every launch.
TEST_F(MlaDecodeGpuTest, FusedMergeLeavesItsCountersAtZero) {
  FusedLaunch f;
  ASSERT_NO_FATAL_FAILURE(prepare_fused_launch("fused counters", {4000, 3000, 70, 9000}, 216, device_sms(), &f));
  for (int i = 0; i < 4; ++i) ASSERT_EQ(launch_mla_decode(f.desc, f.q.get(), f.out.get(), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto arena = f.plan->arena();
  std::vector<int32_t> back(arena.size());
  ASSERT_EQ(cudaMemcpy(back.data(), f.arena.get(), f.plan->arena_bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(back == std::vector<int32_t>(arena.begin(), arena.end()))
      << "the arena (its merge counters) changed across launches";
  // A descriptor that claims the folded merge without counters is refused.
  auto bad = f.desc;
  bad.merge_counters = nullptr;
  EXPECT_EQ(launch_mla_decode(bad, f.q.get(), f.out.get(), nullptr), cudaErrorInvalidValue);
}

// A folded grid the device cannot hold whole (here: planned for four times its SMs, one CTA an SM) is
// refused at launch (the cooperative launch, mla_decode_merge.cuh), where a plain launch could leave CTAs
// waiting forever for rows whose other segments never get an SM. (This case's rows lie in consecutive CTA
// ranges, so a plain launch of it happens to finish: the test then fails on the refusal, not by hanging.)
TEST_F(MlaDecodeGpuTest, FusedMergeGridLargerThanTheDeviceIsRefusedNotHung) {
  if (const char* v = std::getenv("PAGODA_MLA_FUSED_LAUNCH"); v != nullptr && std::strcmp(v, "plain") == 0)
    GTEST_SKIP() << "PAGODA_MLA_FUSED_LAUNCH=plain: no cooperative launch to refuse this grid";
  const int sms = device_sms();
  FusedLaunch f;
  ASSERT_NO_FATAL_FAILURE(prepare_fused_launch("fused oversized", {8192, 8192, 8192, 8192}, 217, 4 * sms, &f));
  ASSERT_GT(f.plan->num_ctas(), sms) << "the case must not fit the device";
  EXPECT_EQ(launch_mla_decode(f.desc, f.q.get(), f.out.get(), nullptr), cudaErrorCooperativeLaunchTooLarge);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the refused launch left the context usable";
}

TEST_F(MlaDecodeGpuTest, Fp8WithoutScalesRefusedAtLaunch) {
  MlaCase c = make_case("fp8", 16, 16, KvElement::kFP8E4M3, {10}, 15);
  const MlaBatch b = make_batch(c);
  std::vector<MlaDecodeRow> rows{{10, b.tables[0]}};
  auto plan = MlaDecodePlan::create(b.config, rows);
  ASSERT_TRUE(plan.ok());
  const auto desc = plan->descriptor(nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(launch_mla_decode(desc, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace pagoda::kernels::cuda
