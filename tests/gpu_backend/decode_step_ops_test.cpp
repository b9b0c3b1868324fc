// Where a batch-1 decode step of the Llama-3-8B shape spends its time, without the attention: each small
// op of a layer alone (replayed from a CUDA graph of 64 copies: its time as a graph node), then the
// 32 layers' sequence minus attention and the KV write (add_rmsnorm, qkv, two ropes, the q copy, o,
// add_rmsnorm, gate_up, silu_mul, down; distinct weights per layer, bf16 or fp8 through the GEMV, or
// through cuBLASLt) replayed as one graph, as the model's decode graph runs it. Printed figures only (no
// bound): the engine's ITL minus these is the attention, the KV write, the head and the host's share.

#include <cstdio>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_support.h"
#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/gemv.h"

namespace pagoda::cuda {
namespace {

// Microseconds per replay of a graph holding `copies` x body, over 20 replays after 3.
double graph_us(cudaStream_t stream, int copies, const std::function<void()>& body) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (int i = 0; i < copies; ++i) body();
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, stream);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  constexpr int kReplays = 20;
  for (int i = 0; i < kReplays; ++i) cudaGraphLaunch(exec, stream);
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return 1000.0 * ms / kReplays;
}

TEST(DecodeStepOpsSpeed, Llama3_8BAtBatch1) {
  PAGODA_SKIP_WITHOUT_GPU();
  constexpr int32_t H = 4096, QH = 32, KVH = 8, D = 128, I = 14336, V = 128256, L = 32;
  constexpr int32_t QKV = (QH + 2 * KVH) * D;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto alloc = [](size_t bytes) {
    auto b = DeviceBuffer::allocate(bytes);
    EXPECT_TRUE(b.ok());
    cudaMemset(b->data(), 0x3c, bytes);  // small finite values in bf16 (and fp8)
    return std::move(*b);
  };
  DeviceBuffer residual = alloc(H * 4), normed = alloc(H * 2), qkv = alloc(QKV * 2), q = alloc(QH * D * 2),
               attn = alloc(QH * D * 2), proj = alloc(H * 2), gate_up = alloc(2 * I * 2), act = alloc(I * 2),
               norm_w = alloc(H * 4), inv_freq = alloc(D / 2 * 4), positions = alloc(4), logits = alloc(size_t{V} * 4),
               tokens = alloc(4), xq = alloc(I), xs = alloc(64), scales = alloc(size_t{2 * I} * 4);
  cudaMemset(positions.data(), 0, 4);
  const std::vector<float> ones(2 * I, 1.0f / 448.0f);
  cudaMemcpy(scales.data(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(norm_w.data(), ones.data(), H * 4, cudaMemcpyHostToDevice);
  const float eps = 1e-5f;
  auto* nb = normed.as<bf16>();

  struct Op { const char* name; std::function<void()> body; };
  const Op ops[] = {
      {"memset 4 B (an empty node)", [&] { cudaMemsetAsync(tokens.data(), 0, 4, stream); }},
      {"add_rmsnorm 4096", [&] { add_rmsnorm(residual.as<float>(), proj.as<bf16>(), norm_w.as<float>(), nb, 1, H, eps, stream); }},
      {"rope q (32 heads)", [&] { rope(qkv.as<bf16>(), QKV, positions.as<int32_t>(), 1, QH, D, inv_freq.as<float>(), stream); }},
      {"rope k (8 heads)", [&] { rope(qkv.as<bf16>() + QH * D, QKV, positions.as<int32_t>(), 1, KVH, D, inv_freq.as<float>(), stream); }},
      {"q copy (cudaMemcpy2DAsync)", [&] {
         cudaMemcpy2DAsync(q.data(), QH * D * 2, qkv.data(), QKV * 2, QH * D * 2, 1, cudaMemcpyDeviceToDevice, stream);
       }},
      {"silu_mul 14336", [&] { silu_mul(gate_up.as<bf16>(), act.as<bf16>(), 1, I, stream); }},
      {"quantize_fp8_per_token 4096", [&] { quantize_fp8_per_token(nb, 1, H, xq.as<uint8_t>(), xs.as<float>(), stream); }},
      {"final rmsnorm 4096", [&] { rmsnorm(residual.as<float>(), nullptr, norm_w.as<float>(), nb, 1, H, eps, stream); }},
      {"argmax 128256", [&] { argmax_rows(logits.as<float>(), 1, V, tokens.as<int32_t>(), stream); }},
  };
  std::printf("decode-ops (batch 1, Llama-3-8B shapes; us per op as a graph node, 64 in a row)\n");
  for (const Op& op : ops) std::printf("decode-ops %-30s %6.2f us\n", op.name, graph_us(stream, 64, op.body) / 64);

  // The layers minus attention and KV write, 32 layers of distinct weights, as one graph.
  const size_t layer_weights = size_t{QKV} * H + size_t{H} * QH * D + size_t{2 * I} * H + size_t{H} * I;
  auto gemm = Gemm::create();
  auto fp8_gemm = Fp8Gemm::create();
  ASSERT_TRUE(gemm.ok());
  for (const bool fp8 : {false, true}) {
    if (fp8 && !fp8_gemm.ok()) continue;
    auto weights = DeviceBuffer::allocate(layer_weights * L * (fp8 ? 1 : 2));
    ASSERT_TRUE(weights.ok());
    cudaMemset(weights->data(), 0x3c, weights->bytes());
    if (fp8) {
      ASSERT_TRUE((*fp8_gemm)->reserve(8, 2 * I).ok());
    }
    for (const bool use_gemv : {true, false}) {
      Status status = ok_status();
      auto project = [&](const bf16* x, const uint8_t* w, int32_t n, int32_t k, bf16* y) {
        if (use_gemv) {
          if (fp8) gemv_fp8(x, 1, w, scales.as<float>(), 0, n, k, y, stream);
          else gemv_bf16(x, 1, reinterpret_cast<const bf16*>(w), n, k, y, false, stream);
        } else if (fp8) {
          quantize_fp8_per_token(x, 1, k, xq.as<uint8_t>(), xs.as<float>(), stream);
          const Status s = (*fp8_gemm)->linear(xq.as<uint8_t>(), xs.as<float>(), 1, w, scales.as<float>(), n, k, y, stream);
          if (!s.ok()) status = s;
        } else {
          const Status s = (*gemm)->linear(x, 1, reinterpret_cast<const bf16*>(w), n, k, y, GemmOutput::kBF16, stream);
          if (!s.ok()) status = s;
        }
      };
      auto layers = [&] {
        const uint8_t* w = weights->as<uint8_t>();
        const size_t e = fp8 ? 1 : 2;
        for (int32_t l = 0; l < L; ++l) {
          add_rmsnorm(residual.as<float>(), proj.as<bf16>(), norm_w.as<float>(), nb, 1, H, eps, stream);
          project(nb, w, QKV, H, qkv.as<bf16>());
          w += size_t{QKV} * H * e;
          rope(qkv.as<bf16>(), QKV, positions.as<int32_t>(), 1, QH, D, inv_freq.as<float>(), stream);
          rope(qkv.as<bf16>() + QH * D, QKV, positions.as<int32_t>(), 1, KVH, D, inv_freq.as<float>(), stream);
          cudaMemcpy2DAsync(q.data(), QH * D * 2, qkv.data(), QKV * 2, QH * D * 2, 1, cudaMemcpyDeviceToDevice, stream);
          project(attn.as<bf16>(), w, H, QH * D, proj.as<bf16>());
          w += size_t{H} * QH * D * e;
          add_rmsnorm(residual.as<float>(), proj.as<bf16>(), norm_w.as<float>(), nb, 1, H, eps, stream);
          project(nb, w, 2 * I, H, gate_up.as<bf16>());
          w += size_t{2 * I} * H * e;
          silu_mul(gate_up.as<bf16>(), act.as<bf16>(), 1, I, stream);
          project(act.as<bf16>(), w, H, I, proj.as<bf16>());
          w += size_t{H} * I * e;
        }
      };
      layers();  // eager: plans and autotuning before the capture
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const double us = graph_us(stream, 1, layers);
      const double floor_us = static_cast<double>(weights->bytes()) / 4.8e6;
      std::printf("decode-ops 32 layers without attention, %s weights via %s: %.3f ms per step (weights %.2f GB, "
                  "read floor at 4.8 TB/s %.3f ms, %.0f GB/s effective)\n",
                  fp8 ? "fp8" : "bf16", use_gemv ? "the GEMV" : "cuBLASLt", us / 1000, weights->bytes() / 1e9,
                  floor_us / 1000, weights->bytes() / (us * 1e3));
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace pagoda::cuda
