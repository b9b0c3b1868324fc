#include "pagoda/backend/cuda/cublaslt_plan.h"

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

}  // namespace pagoda::cuda
