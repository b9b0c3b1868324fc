#include "pagoda/backend/cuda/fp8_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

const char* fp8_scale_mode_name(Fp8ScaleMode mode) {
  switch (mode) {
    case Fp8ScaleMode::kOuterVector: return "outer-vector";
    case Fp8ScaleMode::kEpilogue: return "epilogue";
    case Fp8ScaleMode::kMixed: return "mixed (epilogue <= 64 rows, outer-vector above)";
  }
  return "?";
}

// cuBLAS's narrow-precision table lists outer-vector and the 128-element block
// modes for compute capability 9.0 alone; tensor-wide (scalar) scales for 8.9+.
Fp8ScaleMode default_fp8_scale_mode(int compute_capability) {
  return compute_capability == 90 ? Fp8ScaleMode::kMixed : Fp8ScaleMode::kEpilogue;
}

int32_t fp8_block_groups(int32_t k) { return (k + 127) / 128; }
int32_t fp8_block_padded_rows(int32_t m) { return (m + 3) / 4 * 4; }
int32_t fp8_block_weight_scale_stride(int32_t k) { return (fp8_block_groups(k) + 3) / 4 * 4; }

StatusOr<std::unique_ptr<Fp8Gemm>> Fp8Gemm::create(std::optional<Fp8ScaleMode> mode, size_t workspace_bytes) {
  int device = 0, major = 0, minor = 0;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int cc = major * 10 + minor;
  if (cc < 89)
    return unimplemented_error("fp8 GEMMs need FP8 tensor cores (compute capability 8.9 or newer); device {} is "
                               "{}.{}", device, major, minor);
  const Fp8ScaleMode chosen = mode.value_or(default_fp8_scale_mode(cc));
  if (chosen != Fp8ScaleMode::kEpilogue && cc != 90)
    return unimplemented_error("fp8 outer-vector scales are cuBLASLt's on compute capability 9.0 only; device {} is "
                               "{}.{}", device, major, minor);
  std::unique_ptr<Fp8Gemm> gemm(new Fp8Gemm());
  gemm->mode_ = chosen;
  gemm->compute_capability_ = cc;
  const LtAutotuneSwitches tune = lt_autotune_switches();
  gemm->autotune_ = tune.small_m;
  gemm->autotune_large_ = tune.large_m;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&gemm->handle_));
  PAGODA_ASSIGN_OR_RETURN(gemm->workspace_, DeviceBuffer::allocate(workspace_bytes));
  return gemm;
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [key, plan] : plans_) destroy_lt_plan(plan);
  if (handle_) cublasLtDestroy(handle_);
}

// As in gemm.cpp: row-major y [m, n] is column-major y^T [n, m] = w . x^T, with w
// (column-major [k, n]) transposed: the "TN" layout cuBLASLt's fp8 kernels require.
// A = w carries the weight scales (its n rows), B = x the activation ones. The
// scale pointers are set before the heuristic: cuBLASLt judges the mode with them.
cublasStatus_t Fp8Gemm::make_plan(int32_t weight_mode, int32_t activation_mode, bool f32_output, int32_t m,
                                  int32_t n, int32_t k, const float* x_scales, const float* w_scales,
                                  LtMatmulPlan& plan) {
  auto fail = [&plan](cublasStatus_t status) {
    destroy_lt_plan(plan);
    return status;
  };
  cublasStatus_t s = cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return fail(s);
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  const struct {
    cublasLtMatmulDescAttributes_t attribute;
    const void* value;
    size_t bytes;
  } attributes[] = {
      {CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose},
      {CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof no_transpose},
      {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &weight_mode, sizeof weight_mode},
      {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &activation_mode, sizeof activation_mode},
  };
  for (const auto& a : attributes) {
    // The default (scalar) mode is left unset, as cuBLAS asks of modes not in use.
    if ((a.attribute == CUBLASLT_MATMUL_DESC_A_SCALE_MODE || a.attribute == CUBLASLT_MATMUL_DESC_B_SCALE_MODE) &&
        *static_cast<const int32_t*>(a.value) == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
      continue;
    s = cublasLtMatmulDescSetAttribute(plan.desc, a.attribute, a.value, a.bytes);
    if (s != CUBLAS_STATUS_SUCCESS) return fail(s);
  }
  if (w_scales != nullptr) {
    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales);
    if (s != CUBLAS_STATUS_SUCCESS) return fail(s);
  }
  if (x_scales != nullptr) {
    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales);
    if (s != CUBLAS_STATUS_SUCCESS) return fail(s);
  }
  if ((s = cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, k, n, k)) != CUBLAS_STATUS_SUCCESS) return fail(s);
  if ((s = cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, k, m, k)) != CUBLAS_STATUS_SUCCESS) return fail(s);
  if ((s = cublasLtMatrixLayoutCreate(&plan.c, f32_output ? CUDA_R_32F : CUDA_R_16BF, n, m, n)) !=
      CUBLAS_STATUS_SUCCESS)
    return fail(s);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  s = lt_heuristic(handle_, plan, workspace_.bytes(), &result, 1, &found);
  if (s != CUBLAS_STATUS_SUCCESS) return fail(s);
  if (found == 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED);
  plan.algo = result.algo;
  return CUBLAS_STATUS_SUCCESS;
}

StatusOr<Fp8Gemm::Plan*> Fp8Gemm::plan_for(Kind kind, int32_t m, int32_t n, int32_t k, const float* x_scales,
                                          const float* w_scales) {
  const auto key = std::make_tuple(static_cast<int>(kind), m, n, k);
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  if (k % 16 != 0 || n % 16 != 0)
    return invalid_argument_error("fp8 GEMM: k ({}) and n ({}) must be multiples of 16", k, n);
  int32_t weight_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, activation_mode = weight_mode;
  if (kind == Kind::kOuterVector || kind == Kind::kOuterVectorF32)
    weight_mode = activation_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (kind == Kind::kBlock128) {
    weight_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    activation_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  }
  Plan plan;
  plan.kind = kind;
  plan.n = n;
  plan.k = k;
  const bool f32_output = kind == Kind::kUnitScales || kind == Kind::kOuterVectorF32;
  const cublasStatus_t s = make_plan(weight_mode, activation_mode, f32_output, m, n, k,
                                     kind == Kind::kUnitScales ? nullptr : x_scales,
                                     kind == Kind::kUnitScales ? nullptr : w_scales, plan);
  if (s != CUBLAS_STATUS_SUCCESS)
    return unimplemented_error("cuBLASLt has no fp8 algorithm ({} scales) for m={} n={} k={} (status {})",
                               kind == Kind::kBlock128        ? "128-block"
                               : kind == Kind::kOuterVector    ? "outer-vector"
                               : kind == Kind::kOuterVectorF32 ? "outer-vector, f32 output"
                                                               : "unit",
                               m, n, k, static_cast<int>(s));
  return &plans_.emplace(key, plan).first->second;
}

Status Fp8Gemm::set_scale_pointers(LtMatmulPlan& plan, const float* x_scales, const float* w_scales) {
  PAGODA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales));
  PAGODA_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales));
  return ok_status();
}

Status Fp8Gemm::run(Plan& plan, int32_t m, const uint8_t* x, const uint8_t* w, void* y, cudaStream_t stream) {
  if (!plan.tuned) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) {
      plan.tuned = true;
      if (autotune_ && m <= kMaxTunedRows)
        lt_autotune(handle_, plan, w, x, y, workspace_.data(), workspace_.bytes(), stream, kTunedCandidates);
      else if (autotune_large_ && m > kMaxTunedRows)
        large_tuner_.apply(handle_, plan, static_cast<int>(plan.kind), m, plan.n, plan.k, w, x, y, workspace_.data(),
                           workspace_.bytes(), stream);
    }
  }
  const float alpha = 1.0f, beta = 0.0f;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, y, plan.c, y,
                                               plan.c, &plan.algo, workspace_.data(), workspace_.bytes(), stream));
  return ok_status();
}

Status Fp8Gemm::reserve(int32_t max_m, int32_t max_n) {
  if (mode_ == Fp8ScaleMode::kOuterVector) return ok_status();
  if (mode_ == Fp8ScaleMode::kMixed) max_m = std::min(max_m, kEpilogueMaxRows);
  const size_t bytes = static_cast<size_t>(max_m) * max_n * sizeof(float);
  if (scratch_.bytes() >= bytes) return ok_status();
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the old scratch may still be read
  PAGODA_ASSIGN_OR_RETURN(scratch_, DeviceBuffer::allocate(bytes));
  return ok_status();
}

Status Fp8Gemm::linear(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                       int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream) {
  if (m == 0) return ok_status();
  if (mode_ == Fp8ScaleMode::kOuterVector || (mode_ == Fp8ScaleMode::kMixed && m > kEpilogueMaxRows)) {
    PAGODA_ASSIGN_OR_RETURN(Plan * plan, plan_for(Kind::kOuterVector, m, n, k, x_scales, w_scales));
    PAGODA_RETURN_IF_ERROR(set_scale_pointers(*plan, x_scales, w_scales));
    return run(*plan, m, x, w, y, stream);
  }
  PAGODA_ASSIGN_OR_RETURN(Plan * plan, plan_for(Kind::kUnitScales, m, n, k, nullptr, nullptr));
  const size_t scratch_bytes = static_cast<size_t>(m) * n * sizeof(float);
  if (scratch_.bytes() < scratch_bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)
      return failed_precondition_error("fp8 GEMM: the f32 scratch for m={} n={} must be sized (reserve() or an "
                                       "eager call) before graph capture", m, n);
    PAGODA_RETURN_IF_ERROR(reserve(m, n));
  }
  float* d = scratch_.as<float>();
  PAGODA_RETURN_IF_ERROR(run(*plan, m, x, w, d, stream));
  PAGODA_CUDA_RETURN_IF_ERROR(fp8_apply_outer_scales(d, x_scales, w_scales, m, n, y, stream));
  return ok_status();
}

Status Fp8Gemm::linear_f32(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w,
                           const float* w_scales, int32_t n, int32_t k, float* y, cudaStream_t stream) {
  if (m == 0) return ok_status();
  if (mode_ == Fp8ScaleMode::kEpilogue)
    return unimplemented_error("fp8 GEMM with f32 output: outer-vector scales are sm_90's (mode {})",
                               fp8_scale_mode_name(mode_));
  PAGODA_ASSIGN_OR_RETURN(Plan * plan, plan_for(Kind::kOuterVectorF32, m, n, k, x_scales, w_scales));
  PAGODA_RETURN_IF_ERROR(set_scale_pointers(*plan, x_scales, w_scales));
  return run(*plan, m, x, w, y, stream);
}

Status Fp8Gemm::linear_block128(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w,
                                const float* w_scales, int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream) {
  if (m == 0) return ok_status();
  if (!block128_supported())
    return unimplemented_error("fp8 128x128 block scales are cuBLASLt's on compute capability 9.0 only (this "
                               "device: {})", compute_capability_);
  const int32_t rows = fp8_block_padded_rows(m);
  PAGODA_ASSIGN_OR_RETURN(Plan * plan, plan_for(Kind::kBlock128, rows, n, k, x_scales, w_scales));
  PAGODA_RETURN_IF_ERROR(set_scale_pointers(*plan, x_scales, w_scales));
  return run(*plan, rows, x, w, y, stream);
}

Fp8Gemm::Acceptance Fp8Gemm::probe(int32_t weight_mode, int32_t activation_mode, int32_t m, int32_t n, int32_t k) {
  // Scale pointers: the workspace's start (aligned, large enough for any scale tensor probed here).
  const float* scales = workspace_.as<float>();
  const bool scalar = weight_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F &&
                      activation_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  Plan plan;
  const cublasStatus_t s = make_plan(weight_mode, activation_mode, false, m, n, k, scalar ? nullptr : scales,
                                     scalar ? nullptr : scales, plan);
  destroy_lt_plan(plan);
  return Acceptance{s == CUBLAS_STATUS_SUCCESS, static_cast<int>(s)};
}

}  // namespace pagoda::cuda
