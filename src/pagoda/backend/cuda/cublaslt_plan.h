#pragma once
// What the bf16 (gemm.h) and fp8 (fp8_gemm.h) cuBLASLt wrappers share: a
// matmul plan (descriptor, the A/B/C layouts and the chosen algorithm), its
// teardown, and the heuristic query with a workspace cap.
//
// Thread safety: a plan belongs to one owner; nothing here is synchronized.

#include <cstddef>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace pagoda::cuda {

struct LtMatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Destroys whatever of the plan was created and nulls it (safe to call twice).
void destroy_lt_plan(LtMatmulPlan& plan);

// cublasLtMatmulAlgoGetHeuristic for plan (C and D share plan.c) with at most
// workspace_bytes of workspace: up to `wanted` results into results, their
// number into *found (0 when the status is not success).
cublasStatus_t lt_heuristic(cublasLtHandle_t handle, const LtMatmulPlan& plan, size_t workspace_bytes,
                            cublasLtMatmulHeuristicResult_t* results, int wanted, int* found);

// Times the top `candidates` heuristic algorithms of plan on these operands
// (D = C = d, alpha 1, beta 0; each run 5 times after one warm-up) and keeps the
// fastest in plan.algo. Synchronizes the stream. Returns the cuBLAS status of
// the heuristic query; algorithms that fail to run are skipped.
cublasStatus_t lt_autotune(cublasLtHandle_t handle, LtMatmulPlan& plan, const void* a, const void* b, void* d,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream, int candidates);

}  // namespace pagoda::cuda
