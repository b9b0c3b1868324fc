#pragma once
// FP8 (e4m3) tensor-core GEMMs through cuBLASLt with per-token x per-channel
// scales, and the fused per-token activation quantization that feeds them:
//
//   quantize_fp8_per_token: x bf16 [m, k] -> q fp8 [m, k] and s f32 [m], with
//     s[r] = amax(x[r, :]) / 448 and q = fp8(x / s) (round to nearest even,
//     saturating): the arithmetic of model/fp8_matrix.h's kDynamicToken, byte
//     for byte.
//   Fp8Gemm::linear: y bf16 [m, n] = (s_x[m] x s_w[n]) * (q_x [m, k] . q_w [n, k]^T),
//     f32 accumulation. Where cuBLASLt offers outer-vector scaling
//     (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on both operands) the scales
//     are applied inside the GEMM. On the H200 with CUDA 13's cuBLASLt the
//     heuristic refuses that mode (status 7, measured), so there the GEMM runs
//     with unit scales into an f32 scratch [m, n] and fp8_apply_outer_scales
//     applies both scale vectors and rounds to bf16. A per-tensor weight scale
//     is passed as a vector of n equal values.
//
// This is the building block of the GPU's fp8 Linear layers; the CUDA model
// does not call it yet (FP8 checkpoints upload dequantized to bf16 there).
// Requirements (cuBLASLt FP8): k % 16 == 0, n % 16 == 0; the device must be
// sm_89 or newer (create() checks: an error names the device otherwise).
//
// Thread safety: one Fp8Gemm per stream owner; plans are cached per shape, so
// after the first call of a shape a call only enqueues work (graph capturable
// once an eager call of the largest m x n has sized the f32 scratch).

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <tuple>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/fp8_ops.h"  // quantize_fp8_per_token
#include "pagoda/core/status.h"

namespace pagoda::cuda {

class Fp8Gemm {
 public:
  // Errors: no FP8 tensor cores on the current device (compute capability < 8.9).
  static StatusOr<std::unique_ptr<Fp8Gemm>> create(size_t workspace_bytes = 32ull << 20);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // y [m, n] bf16 = diag(x_scales) (x [m, k] . w [n, k]^T) diag(w_scales); x, w fp8 e4m3 row-major;
  // x_scales [m], w_scales [n] f32 on the device. m may be 0. Errors: shapes cuBLASLt cannot run.
  Status linear(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool outer_vector = false;  // scales inside the GEMM; else unit scales into f32 + the epilogue
  };
  Fp8Gemm() = default;
  StatusOr<Plan*> plan_for(int32_t m, int32_t n, int32_t k, const float* x_scales, const float* w_scales);
  // A plan with outer-vector scales, or nullopt where cuBLASLt has no algorithm for it.
  StatusOr<std::optional<Plan>> make_plan(int32_t m, int32_t n, int32_t k, bool outer_vector, const float* x_scales,
                                          const float* w_scales);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer scratch_;  // f32 [m, n] of the unit-scale path; grows on eager calls only
  std::map<std::tuple<int32_t, int32_t, int32_t>, Plan> plans_;
};

}  // namespace pagoda::cuda
