// The GEMV's programmatic dependent launch (backend/cuda/pdl.cuh, switched on here) inside a CUDA graph: the GEMV's blocks
// start while the norm ahead of it still runs and stream weights before their PDL wait, so they must read
// the norm's output only after it. The graph clears the activations, norms a residual into them and runs
// the GEMV; replayed with a new residual each time, every output must equal, bit for bit, the same two
// kernels run with a device synchronization between them (the GEMV's reduction order is fixed). A GEMV
// that read its activations before the wait would see the cleared buffer (zeros) or the previous residual's.
// bf16 and fp8 weights, 1 and 2 rows, the 8B model's widest activation (k = 4096) at n = 6144.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/gemv.h"
#include "pagoda/backend/cuda/pdl.cuh"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {
namespace {

using testing::random_bf16_values;
using testing::to_bf16_bits;
using testing::to_device;
using testing::to_host;

struct PdlCase {
  int32_t m;
  bool fp8;
};

class GemvPdlTest : public ::testing::TestWithParam<PdlCase> {};

TEST_P(GemvPdlTest, GraphReplaysMatchTheSynchronizedKernels) {
  PAGODA_SKIP_WITHOUT_GPU();
  const PdlCase c = GetParam();
  constexpr int32_t n = 6144, k = 4096;
  const std::vector<float> norm_weight = random_bf16_values(k, 0.5f, 1.5f, 71);
  const std::vector<float> w = random_bf16_values(static_cast<size_t>(n) * k, -0.1f, 0.1f, 72);
  std::vector<uint8_t> w8(w.size());
  for (size_t i = 0; i < w.size(); ++i) w8[i] = f32_to_fp8e4m3(w[i] * 4.0f);
  const std::vector<float> scales(n, 0.25f);
  DeviceBuffer d_norm_weight = to_device(norm_weight);
  DeviceBuffer d_w = to_device(to_bf16_bits(w));
  DeviceBuffer d_w8 = to_device(w8);
  DeviceBuffer d_scales = to_device(scales);
  auto d_residual = DeviceBuffer::allocate(static_cast<size_t>(c.m) * k * 4);
  auto d_x = DeviceBuffer::allocate(static_cast<size_t>(c.m) * k * 2);
  auto d_y = DeviceBuffer::allocate(static_cast<size_t>(c.m) * n * 2);
  ASSERT_TRUE(d_residual.ok() && d_x.ok() && d_y.ok());
  // Programmatic launches on for this test (off by default), restored at the end.
  struct PdlOn {
    bool was = pdl_enabled();
    PdlOn() { set_pdl_enabled(true); }
    ~PdlOn() { set_pdl_enabled(was); }
  } pdl_on;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto norm_then_gemv = [&](bool synchronize) {
    ASSERT_EQ(cudaMemsetAsync(d_x->data(), 0, d_x->bytes(), stream), cudaSuccess);
    ASSERT_EQ(add_rmsnorm(d_residual->as<float>(), nullptr, d_norm_weight.as<float>(), d_x->as<bf16>(), c.m, k, 1e-5f,
                          stream),
              cudaSuccess);
    if (synchronize) {
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    if (c.fp8) {
      ASSERT_EQ(gemv_fp8(d_x->as<__nv_bfloat16>(), c.m, d_w8.as<uint8_t>(), d_scales.as<float>(), 0, n, k,
                         d_y->as<__nv_bfloat16>(), stream),
                cudaSuccess);
    } else {
      ASSERT_EQ(gemv_bf16(d_x->as<__nv_bfloat16>(), c.m, d_w.as<__nv_bfloat16>(), n, k, d_y->data(), false, stream),
                cudaSuccess);
    }
    if (synchronize) {
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
  };
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  norm_then_gemv(false);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const size_t out = static_cast<size_t>(c.m) * n;
  for (uint32_t replay = 0; replay < 6; ++replay) {
    const std::vector<float> residual = random_bf16_values(static_cast<size_t>(c.m) * k, -3, 3, 80 + replay);
    ASSERT_EQ(cudaMemcpy(d_residual->data(), residual.data(), residual.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    norm_then_gemv(true);
    const std::vector<uint16_t> want = to_host<uint16_t>(*d_y, out);
    ASSERT_EQ(cudaMemset(d_y->data(), 0xff, d_y->bytes()), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<uint16_t> got = to_host<uint16_t>(*d_y, out);
    size_t differing = 0;
    for (size_t i = 0; i < out; ++i) differing += got[i] != want[i];
    EXPECT_EQ(differing, 0u) << "replay " << replay << ": outputs differing from the synchronized kernels";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Llama3_8BWidth, GemvPdlTest,
                         ::testing::Values(PdlCase{1, false}, PdlCase{2, false}, PdlCase{1, true}, PdlCase{2, true}),
                         [](const ::testing::TestParamInfo<PdlCase>& info) {
                           return std::string(info.param.fp8 ? "fp8" : "bf16") + "_m" + std::to_string(info.param.m);
                         });

}  // namespace
}  // namespace pagoda::cuda
