// The fast paged attention kernels against the float64 CPU reference and the
// naive GPU kernel, on random data, odd lengths, scattered block tables and
// cached prefixes that end mid-block. Runs only where a CUDA device is present
// (label gpu); elsewhere every test skips.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "attention_test_support.h"
#include "pagoda/backend/cuda/attention/attention_kernels.h"
#include "pagoda/backend/cuda/attention/cuda_status.h"

namespace pagoda::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::PagedBatch;
using testing::SequenceShape;

// bf16 inputs and output, f32 accumulation: the output rounding alone is ~2e-3.
constexpr double kMaxRelativeError = 1e-2;

enum class Path { kFast, kNaive, kFastGraph };

struct DeviceBatch {
  DeviceBuffer key, value, q, out, arena, workspace;
  AttentionDescriptor desc;
};

// Uploads the batch, plans and launches; returns the bf16 output (poisoned with
// NaN before the launch, so an unwritten element fails the comparison).
StatusOr<std::vector<uint16_t>> run_attention(const PagedBatch& b, Path path,
                                              const AttentionPlanOptions& options = {},
                                              AttentionKernel* kernel_used = nullptr) {
  cudaDeviceProp prop{};
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  const auto sequences = b.sequences();
  PAGODA_ASSIGN_OR_RETURN(auto plan, PagedAttentionPlan::create(
                                         b.config, sequences,
                                         AttentionDeviceInfo{prop.multiProcessorCount}, options));
  if (kernel_used) *kernel_used = plan.kernel();
  const size_t out_bytes = b.q.size() * 2;
  DeviceBatch d;
  d.key = DeviceBuffer(b.key.size() * 2);
  d.value = DeviceBuffer(b.value.size() * 2);
  d.q = DeviceBuffer(b.q.size() * 2);
  d.out = DeviceBuffer(out_bytes);
  d.arena = DeviceBuffer(plan.arena_bytes());
  d.workspace = DeviceBuffer(plan.workspace_bytes());
  for (auto* buf : {&d.key, &d.value, &d.q, &d.out, &d.arena, &d.workspace})
    if (!buf->ok()) return resource_exhausted_error("cudaMalloc of {} bytes failed", buf->bytes());
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.key.get(), b.key.data(), b.key.size() * 2, cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.value.get(), b.value.data(), b.value.size() * 2, cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.q.get(), b.q.data(), b.q.size() * 2, cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.arena.get(), plan.arena().data(), plan.arena_bytes(), cudaMemcpyHostToDevice));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(d.out.get(), 0xff, out_bytes));  // bf16 NaN
  if (plan.workspace_bytes() > 0)
    PAGODA_CUDA_RETURN_IF_ERROR(cudaMemset(d.workspace.get(), 0xff, plan.workspace_bytes()));
  const AttentionDescriptor desc = plan.descriptor(
      d.arena.get<int32_t>(), PagedKvPointers{d.key.get(), d.value.get()}, d.workspace.get<float>());

  cudaStream_t stream;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  Status launched;
  if (path == Path::kNaive) {
    launched = cuda_status(
        launch_naive_paged_attention(desc, d.q.get(), d.out.get(), b.max_length(), stream),
        "naive attention", __FILE__, __LINE__);
  } else if (path == Path::kFast) {
    launched = cuda_status(launch_paged_attention(desc, d.q.get(), d.out.get(), stream),
                           "paged attention", __FILE__, __LINE__);
  } else {
    // Capture the launch in a graph and replay it twice: proves the launch is capturable.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const cudaError_t err = launch_paged_attention(desc, d.q.get(), d.out.get(), stream);
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream, &graph));
    PAGODA_CUDA_RETURN_IF_ERROR(err);
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  PAGODA_RETURN_IF_ERROR(launched);
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
  std::vector<uint16_t> out(b.q.size());
  PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), d.out.get(), out_bytes, cudaMemcpyDeviceToHost));
  return out;
}

struct AttentionCase {
  std::string name;
  int32_t q_heads, kv_heads, head_dim, block_size;
  std::vector<SequenceShape> shapes;
  int32_t split_tokens = 0;  // decode: 0 = automatic
  AttentionKernel expected_kernel = AttentionKernel::kDecode;
};

std::ostream& operator<<(std::ostream& os, const AttentionCase& c) { return os << c.name; }

class PagedAttentionGpuTest : public ::testing::TestWithParam<AttentionCase> {
 protected:
  void SetUp() override {
    if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(prepare_paged_attention_kernels(), cudaSuccess);
  }
};

TEST_P(PagedAttentionGpuTest, FastAndNaiveMatchFloat64Reference) {
  const AttentionCase& c = GetParam();
  const PagedBatch batch = testing::make_paged_batch(c.q_heads, c.kv_heads, c.head_dim,
                                                     c.block_size, c.shapes, 1234u + c.head_dim);
  const std::vector<double> want = testing::reference_attention(batch);
  AttentionKernel kernel{};
  auto fast = run_attention(batch, Path::kFast, {c.split_tokens, false, false}, &kernel);
  ASSERT_TRUE(fast.ok()) << fast.status().to_string();
  const AttentionKernel expected =
      c.expected_kernel == AttentionKernel::kPrefill && c.head_dim == 128
          ? AttentionKernel::kPrefillSm90  // wgmma wherever it applies
          : c.expected_kernel;
  EXPECT_EQ(kernel, expected);
  auto naive = run_attention(batch, Path::kNaive);
  ASSERT_TRUE(naive.ok()) << naive.status().to_string();
  const double fast_error = testing::relative_l2(*fast, want);
  const double naive_error = testing::relative_l2(*naive, want);
  std::vector<double> naive_as_double(naive->size());
  for (size_t i = 0; i < naive->size(); ++i) naive_as_double[i] = bf16_to_f32((*naive)[i]);
  const double fast_vs_naive = testing::relative_l2(*fast, naive_as_double);
  std::printf("[%s] rel L2: fast %.2e, naive %.2e, fast vs naive %.2e\n", c.name.c_str(),
              fast_error, naive_error, fast_vs_naive);
  EXPECT_LT(fast_error, kMaxRelativeError);
  EXPECT_LT(naive_error, kMaxRelativeError);
  EXPECT_LT(fast_vs_naive, kMaxRelativeError);
  if (c.expected_kernel == AttentionKernel::kDecode) {
    // Decode has two loops (tensor cores by default at head_dim 64 / 128, CUDA cores): both stay checked.
    AttentionPlanOptions cuda_cores;
    cuda_cores.split_tokens = c.split_tokens;
    cuda_cores.decode_cuda_cores = true;
    auto other = run_attention(batch, Path::kFast, cuda_cores);
    ASSERT_TRUE(other.ok()) << other.status().to_string();
    const double other_error = testing::relative_l2(*other, want);
    std::printf("[%s] rel L2: cuda-core decode %.2e\n", c.name.c_str(), other_error);
    EXPECT_LT(other_error, kMaxRelativeError);
  }
}

// Odd lengths, lengths not a multiple of the block, a single-position sequence.
const std::vector<SequenceShape> kDecodeLengths = {
    {1, 0}, {1, 16}, {1, 254}, {1, 999}, {1, 2048}, {1, 332}, {1, 4096}};

INSTANTIATE_TEST_SUITE_P(
    Decode, PagedAttentionGpuTest,
    ::testing::Values(
        AttentionCase{"gqa32x8_d128_bs16_auto", 32, 8, 128, 16, kDecodeLengths},
        AttentionCase{"gqa32x8_d128_bs16_split256", 32, 8, 128, 16, kDecodeLengths, 256},
        AttentionCase{"gqa32x8_d128_bs8_split512", 32, 8, 128, 8, kDecodeLengths, 512},
        AttentionCase{"gqa32x8_d128_bs32", 32, 8, 128, 32, kDecodeLengths},
        AttentionCase{"gqa32x8_d128_bs64_split256", 32, 8, 128, 64, kDecodeLengths, 256},
        AttentionCase{"mha8_d64_bs16_split256", 8, 8, 64, 16, kDecodeLengths, 256},
        AttentionCase{"gqa12x4_d64_bs32", 12, 4, 64, 32, kDecodeLengths},
        AttentionCase{"mqa16x1_d256_bs8_split256", 16, 1, 256, 8, kDecodeLengths, 256},
        AttentionCase{"gqa8x4_d256_bs64", 8, 4, 256, 64, kDecodeLengths},
        AttentionCase{"gqa64x8_d128_bs16_split1024", 64, 8, 128, 16, kDecodeLengths, 1024},
        AttentionCase{"gqa8x2_d128_bs2_split512", 8, 2, 128, 2, kDecodeLengths, 512},
        AttentionCase{"mha4_d64_bs1", 4, 4, 64, 1, kDecodeLengths},
        // More than 32 splits of one sequence (the merge reads the splits' weights 32 per pass), and
        // query heads that are not a multiple of the merge's 4 heads per CTA.
        AttentionCase{"gqa32x8_d128_bs16_split64", 32, 8, 128, 16, kDecodeLengths, 64},
        AttentionCase{"gqa6x2_d64_bs16_split64", 6, 2, 64, 16, kDecodeLengths, 64},
        AttentionCase{"mqa10x1_d256_bs16_split60", 10, 1, 256, 16, kDecodeLengths, 60}),
    [](const auto& info) { return info.param.name; });

// Varlen batches: fresh prompts, prefixes ending mid-block, chunks after long
// prefixes, single-token rows mixed in (decodes in a mixed batch).
const std::vector<SequenceShape> kPrefillShapes = {
    {37, 0}, {1, 20}, {200, 45}, {129, 300}, {5, 1001}, {64, 64}, {300, 7}};

INSTANTIATE_TEST_SUITE_P(
    Prefill, PagedAttentionGpuTest,
    ::testing::Values(
        AttentionCase{"gqa32x8_d128_bs16", 32, 8, 128, 16, kPrefillShapes, 0,
                      AttentionKernel::kPrefill},
        AttentionCase{"mha4_d64_bs8", 4, 4, 64, 8, kPrefillShapes, 0, AttentionKernel::kPrefill},
        AttentionCase{"mha4_d128_bs64", 4, 4, 128, 64, kPrefillShapes, 0,
                      AttentionKernel::kPrefill},
        AttentionCase{"mqa8x1_d128_bs32", 8, 1, 128, 32, kPrefillShapes, 0,
                      AttentionKernel::kPrefill},
        AttentionCase{"gqa6x2_d64_bs16", 6, 2, 64, 16, kPrefillShapes, 0,
                      AttentionKernel::kPrefill},
        AttentionCase{"long_prompt_gqa8x2_d128_bs16", 8, 2, 128, 16, {{1500, 0}, {777, 1234}}, 0,
                      AttentionKernel::kPrefill}),
    [](const auto& info) { return info.param.name; });

class PagedAttentionGpuProperties : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(prepare_paged_attention_kernels(), cudaSuccess);
  }
};

TEST_F(PagedAttentionGpuProperties, SplitAndUnsplitDecodeAgree) {
  const PagedBatch b = testing::make_paged_batch(32, 8, 128, 16, kDecodeLengths, 77);
  auto whole = run_attention(b, Path::kFast, {1 << 20, false, false});
  auto split = run_attention(b, Path::kFast, {256, false, false});
  ASSERT_TRUE(whole.ok() && split.ok());
  std::vector<double> whole_d(whole->size());
  for (size_t i = 0; i < whole->size(); ++i) whole_d[i] = bf16_to_f32((*whole)[i]);
  EXPECT_LT(testing::relative_l2(*split, whole_d), 5e-3);
}

TEST_F(PagedAttentionGpuProperties, PrefillKernelOnADecodeBatchMatchesDecodeKernel) {
  const PagedBatch b = testing::make_paged_batch(32, 8, 128, 16, kDecodeLengths, 78);
  AttentionKernel first{}, second{};
  auto decode = run_attention(b, Path::kFast, {}, &first);
  auto prefill = run_attention(b, Path::kFast, {0, true, false}, &second);
  ASSERT_TRUE(decode.ok() && prefill.ok());
  EXPECT_EQ(first, AttentionKernel::kDecode);
  EXPECT_EQ(second, AttentionKernel::kPrefillSm90);
  const auto want = testing::reference_attention(b);
  EXPECT_LT(testing::relative_l2(*prefill, want), kMaxRelativeError);
  EXPECT_LT(testing::relative_l2(*decode, want), kMaxRelativeError);
}

TEST_F(PagedAttentionGpuProperties, WgmmaAndMmaSyncPrefillAgree) {
  for (const auto& shapes : {kPrefillShapes, std::vector<SequenceShape>{{1000, 0}, {333, 2500}}}) {
    const PagedBatch b = testing::make_paged_batch(32, 8, 128, 16, shapes, 81);
    AttentionKernel first{}, second{};
    auto hopper = run_attention(b, Path::kFast, {}, &first);
    auto portable = run_attention(b, Path::kFast, {0, false, true}, &second);
    ASSERT_TRUE(hopper.ok() && portable.ok());
    EXPECT_EQ(first, AttentionKernel::kPrefillSm90);
    EXPECT_EQ(second, AttentionKernel::kPrefill);
    const auto want = testing::reference_attention(b);
    const double hopper_error = testing::relative_l2(*hopper, want);
    const double portable_error = testing::relative_l2(*portable, want);
    std::printf("[wgmma vs mma.sync] rel L2: wgmma %.2e, mma.sync %.2e\n", hopper_error,
                portable_error);
    EXPECT_LT(hopper_error, kMaxRelativeError);
    EXPECT_LT(portable_error, kMaxRelativeError);
  }
}

TEST_F(PagedAttentionGpuProperties, GraphReplayEqualsDirectLaunchBitForBit) {
  for (const auto& shapes : {kDecodeLengths, kPrefillShapes}) {
    const PagedBatch b = testing::make_paged_batch(32, 8, 128, 16, shapes, 79);
    auto direct = run_attention(b, Path::kFast, {256, false, false});
    auto graph = run_attention(b, Path::kFastGraph, {256, false, false});
    ASSERT_TRUE(direct.ok()) << direct.status().to_string();
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    EXPECT_EQ(*direct, *graph);
  }
}

TEST_F(PagedAttentionGpuProperties, RepeatedRunsAreBitIdentical) {
  // A changing result on the same input would mean a race.
  const PagedBatch b = testing::make_paged_batch(16, 4, 128, 16, kPrefillShapes, 80);
  auto first = run_attention(b, Path::kFast);
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 3; ++i) {
    auto again = run_attention(b, Path::kFast);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*first, *again);
  }
}

}  // namespace
}  // namespace pagoda::kernels::cuda
