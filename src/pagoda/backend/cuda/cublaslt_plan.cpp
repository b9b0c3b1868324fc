#include "pagoda/backend/cuda/cublaslt_plan.h"

#include <limits>
#include <vector>

namespace pagoda::cuda {

void destroy_lt_plan(LtMatmulPlan& plan) {
  if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  plan.a = plan.b = plan.c = nullptr;
  plan.desc = nullptr;
}

cublasStatus_t lt_heuristic(cublasLtHandle_t handle, const LtMatmulPlan& plan, size_t workspace_bytes,
                            cublasLtMatmulHeuristicResult_t* results, int wanted, int* found) {
  *found = 0;
  cublasLtMatmulPreference_t preference = nullptr;
  cublasStatus_t status = cublasLtMatmulPreferenceCreate(&preference);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_bytes, sizeof workspace_bytes);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, preference, wanted,
                                            results, found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS) *found = 0;
  return status;
}

cublasStatus_t lt_autotune(cublasLtHandle_t handle, LtMatmulPlan& plan, const void* a, const void* b, void* d,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream, int candidates) {
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(candidates));
  int found = 0;
  const cublasStatus_t heuristic = lt_heuristic(handle, plan, workspace_bytes, results.data(), candidates, &found);
  if (heuristic != CUBLAS_STATUS_SUCCESS || found <= 1) return heuristic;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start) cudaEventDestroy(start);
    cudaGetLastError();
    return CUBLAS_STATUS_SUCCESS;  // untuned: the first heuristic stays
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.c, d, plan.c, &algo,
                          workspace, workspace_bytes, stream);
  };
  float best_ms = std::numeric_limits<float>::infinity();
  constexpr int kRuns = 5;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || run(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int r = 0; r < kRuns && ok; ++r) ok = run(results[i].algo) == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(stop, stream);
    if (cudaEventSynchronize(stop) != cudaSuccess || !ok) continue;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (ms < best_ms) {
      best_ms = ms;
      plan.algo = results[i].algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace pagoda::cuda
