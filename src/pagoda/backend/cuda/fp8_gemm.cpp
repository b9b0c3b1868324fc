#include "pagoda/backend/cuda/fp8_gemm.h"

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

StatusOr<std::unique_ptr<Fp8Gemm>> Fp8Gemm::create(size_t workspace_bytes) {
  int device = 0, major = 0, minor = 0;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < 89)
    return unimplemented_error("fp8 GEMMs need FP8 tensor cores (compute capability 8.9 or newer); device {} is "
                               "{}.{}", device, major, minor);
  std::unique_ptr<Fp8Gemm> gemm(new Fp8Gemm());
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&gemm->handle_));
  PAGODA_ASSIGN_OR_RETURN(gemm->workspace_, DeviceBuffer::allocate(workspace_bytes));
  return gemm;
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [key, plan] : plans_) {
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  }
  if (handle_) cublasLtDestroy(handle_);
}

// As in gemm.cpp: row-major y [m, n] is column-major y^T [n, m] = w . x^T, with w
// (column-major [k, n]) transposed: the "TN" layout cuBLASLt's fp8 kernels require.
// A = w carries the per-channel scales (its n rows), B = x the per-token ones.
// The scale pointers are set before the heuristic: cuBLASLt judges the mode with them.
StatusOr<std::optional<Fp8Gemm::Plan>> Fp8Gemm::make_plan(int32_t m, int32_t n, int32_t k, bool outer_vector,
                                                          const float* x_scales, const float* w_scales) {
  Plan plan;
  plan.outer_vector = outer_vector;
  auto destroy = [&plan] {
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  };
  auto check = [&destroy](cublasStatus_t status, const char* what) -> Status {
    if (status == CUBLAS_STATUS_SUCCESS) return ok_status();
    destroy();
    return internal_error("fp8 GEMM plan: {} failed (cuBLAS status {})", what, static_cast<int>(status));
  };
  PAGODA_RETURN_IF_ERROR(check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  PAGODA_RETURN_IF_ERROR(check(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "TRANSA"));
  PAGODA_RETURN_IF_ERROR(check(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof no_transpose),
      "TRANSB"));
  if (outer_vector) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    PAGODA_RETURN_IF_ERROR(check(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode), "A mode"));
    PAGODA_RETURN_IF_ERROR(check(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode), "B mode"));
    PAGODA_RETURN_IF_ERROR(check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                                &w_scales, sizeof w_scales), "A scale"));
    PAGODA_RETURN_IF_ERROR(check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                                &x_scales, sizeof x_scales), "B scale"));
  }
  PAGODA_RETURN_IF_ERROR(check(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, k, n, k), "A layout"));
  PAGODA_RETURN_IF_ERROR(check(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, k, m, k), "B layout"));
  PAGODA_RETURN_IF_ERROR(
      check(cublasLtMatrixLayoutCreate(&plan.c, outer_vector ? CUDA_R_16BF : CUDA_R_32F, n, m, n), "C layout"));

  cublasLtMatmulPreference_t preference = nullptr;
  PAGODA_RETURN_IF_ERROR(check(cublasLtMatmulPreferenceCreate(&preference), "preference"));
  const size_t workspace_bytes = workspace_.bytes();
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof workspace_bytes);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c,
                                                                  plan.c, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (heuristic != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy();
    if (outer_vector) return std::optional<Plan>();
    return unimplemented_error("cuBLASLt has no fp8 algorithm for m={} n={} k={} (status {})", m, n, k,
                               static_cast<int>(heuristic));
  }
  plan.algo = result.algo;
  return std::optional<Plan>(plan);
}

StatusOr<Fp8Gemm::Plan*> Fp8Gemm::plan_for(int32_t m, int32_t n, int32_t k, const float* x_scales,
                                           const float* w_scales) {
  const auto key = std::make_tuple(m, n, k);
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  if (k % 16 != 0 || n % 16 != 0)
    return invalid_argument_error("fp8 GEMM: k ({}) and n ({}) must be multiples of 16", k, n);
  PAGODA_ASSIGN_OR_RETURN(std::optional<Plan> plan, make_plan(m, n, k, /*outer_vector=*/true, x_scales, w_scales));
  if (!plan) {
    PAGODA_ASSIGN_OR_RETURN(plan, make_plan(m, n, k, /*outer_vector=*/false, nullptr, nullptr));
  }
  return &plans_.emplace(key, *plan).first->second;
}

Status Fp8Gemm::linear(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                       int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream) {
  if (m == 0) return ok_status();
  PAGODA_ASSIGN_OR_RETURN(Plan* plan, plan_for(m, n, k, x_scales, w_scales));
  const float alpha = 1.0f, beta = 0.0f;
  if (plan->outer_vector) {
    PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                                 &w_scales, sizeof w_scales));
    PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                                 &x_scales, sizeof x_scales));
    PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan->desc, &alpha, w, plan->a, x, plan->b, &beta, y,
                                                 plan->c, y, plan->c, &plan->algo, workspace_.data(),
                                                 workspace_.bytes(), stream));
    return ok_status();
  }
  const size_t scratch_bytes = static_cast<size_t>(m) * n * sizeof(float);
  if (scratch_.bytes() < scratch_bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)
      return failed_precondition_error("fp8 GEMM: the f32 scratch for m={} n={} must be sized by an eager call "
                                       "before graph capture", m, n);
    PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the old scratch may still be read
    PAGODA_ASSIGN_OR_RETURN(scratch_, DeviceBuffer::allocate(scratch_bytes));
  }
  float* d = scratch_.as<float>();
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan->desc, &alpha, w, plan->a, x, plan->b, &beta, d,
                                               plan->c, d, plan->c, &plan->algo, workspace_.data(),
                                               workspace_.bytes(), stream));
  PAGODA_CUDA_RETURN_IF_ERROR(fp8_apply_outer_scales(d, x_scales, w_scales, m, n, y, stream));
  return ok_status();
}

}  // namespace pagoda::cuda
