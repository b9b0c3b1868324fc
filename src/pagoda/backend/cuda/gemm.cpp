#include "pagoda/backend/cuda/gemm.h"

#include <cstdlib>
#include <cstring>

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

StatusOr<std::unique_ptr<Gemm>> Gemm::create(size_t workspace_bytes) {
  std::unique_ptr<Gemm> gemm(new Gemm());
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&gemm->handle_));
  PAGODA_ASSIGN_OR_RETURN(gemm->workspace_, DeviceBuffer::allocate(workspace_bytes));
  const LtAutotuneSwitches tune = lt_autotune_switches();
  gemm->autotune_ = tune.small_m;
  gemm->autotune_large_ = tune.large_m;
  return gemm;
}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) destroy_lt_plan(plan);
  if (handle_) cublasLtDestroy(handle_);
}

// cuBLAS is column-major: row-major y[m, n] is column-major y^T [n, m] = w · x^T,
// where row-major w [n, k] is column-major [k, n] used transposed, and row-major
// x [m, k] is column-major [k, m] used as is.
StatusOr<Gemm::Plan*> Gemm::plan_for(int32_t m, int32_t n, int32_t k, GemmOutput output) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(output));
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;

  Plan plan;
  plan.n = n;
  plan.k = k;
  plan.output = static_cast<int>(output);
  const cudaDataType_t out_type = output == GemmOutput::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                               sizeof transpose));
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &no_transpose, sizeof no_transpose));
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, k));
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, k));
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.c, out_type, n, m, n));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t heuristic = lt_heuristic(handle_, plan, workspace_.bytes(), &result, 1, &found);
  if (heuristic != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy_lt_plan(plan);
    return internal_error("cuBLASLt has no bf16 algorithm for m={} n={} k={} (status {})", m, n, k,
                          static_cast<int>(heuristic));
  }
  plan.algo = result.algo;
  return &plans_.emplace(key, plan).first->second;
}

Status Gemm::linear(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t n, int32_t k, void* y,
                    GemmOutput output, cudaStream_t stream) {
  if (m == 0) return ok_status();
  PAGODA_ASSIGN_OR_RETURN(Plan* plan, plan_for(m, n, k, output));
  if (!plan->tuned) PAGODA_RETURN_IF_ERROR(autotune(*plan, x, m, w, y, stream));
  const float alpha = 1.0f, beta = 0.0f;
  PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan->desc, &alpha, w, plan->a, x, plan->b, &beta, y,
                                               plan->c, y, plan->c, &plan->algo, workspace_.data(),
                                               workspace_.bytes(), stream));
  return ok_status();
}

Status Gemm::autotune(Plan& plan, const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, void* y,
                      cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return ok_status();  // try again on an eager call
  plan.tuned = true;
  if (m > kMaxTunedRows) {
    if (autotune_large_)
      large_tuner_.apply(handle_, plan, plan.output, m, plan.n, plan.k, w, x, y, workspace_.data(), workspace_.bytes(),
                         stream);
    return ok_status();
  }
  if (!autotune_) return ok_status();
  lt_autotune(handle_, plan, w, x, y, workspace_.data(), workspace_.bytes(), stream, kTunedCandidates);
  return ok_status();
}

}  // namespace pagoda::cuda
