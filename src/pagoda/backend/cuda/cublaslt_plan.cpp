#include "pagoda/backend/cuda/cublaslt_plan.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
                           void* workspace, size_t workspace_bytes, cudaStream_t stream, int candidates,
                           int runs) {
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
  const int kRuns = runs;
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

bool lt_algo_fits(cublasLtHandle_t handle, const LtMatmulPlan& plan, const cublasLtMatmulAlgo_t& algo,
                  size_t workspace_bytes) {
  cublasLtMatmulHeuristicResult_t result{};
  const cublasStatus_t s =
      cublasLtMatmulAlgoCheck(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, &algo, &result);
  return s == CUBLAS_STATUS_SUCCESS && result.state == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= workspace_bytes;
}

LtAutotuneSwitches lt_autotune_switches() {
  auto on = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::strcmp(v, "1") == 0;
  };
  return LtAutotuneSwitches{on("PAGODA_GEMM_AUTOTUNE"), on("PAGODA_GEMM_AUTOTUNE_LARGE")};
}

int32_t lt_row_bucket(int32_t m) {
  int32_t bucket = 1;
  while (bucket < m && bucket < (int32_t{1} << 30)) bucket <<= 1;
  return bucket;
}

void LtLargeRowTuner::apply(cublasLtHandle_t handle, LtMatmulPlan& plan, int key, int32_t m, int32_t n, int32_t k,
                            const void* a, const void* b, void* d, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  const auto bucket_key = std::make_tuple(key, n, k, lt_row_bucket(m));
  if (auto it = algos_.find(bucket_key); it != algos_.end()) {
    if (lt_algo_fits(handle, plan, it->second, workspace_bytes)) {
      plan.algo = it->second;
      ++stats_.reused;
    } else {
      ++stats_.rejected;
    }
    return;
  }
  const cublasLtMatmulAlgo_t first = plan.algo;
  cudaStreamSynchronize(stream);
  const auto t0 = std::chrono::steady_clock::now();
  lt_autotune(handle, plan, a, b, d, workspace, workspace_bytes, stream, kCandidates, kRuns);
  stats_.tune_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.tuned;
  const bool changed = std::memcmp(&first, &plan.algo, sizeof first) != 0;
  if (changed) ++stats_.changed;
  algos_.emplace(bucket_key, plan.algo);
  // PAGODA_GEMM_TUNE_LOG=1: a line per tuning on stderr (what a run spent tuning, and where).
  static const bool log = [] {
    const char* env = std::getenv("PAGODA_GEMM_TUNE_LOG");
    return env != nullptr && std::strcmp(env, "0") != 0;
  }();
  if (log)
    std::fprintf(stderr, "gemm-tune: key %d n=%d k=%d m=%d (bucket %d): %.1f ms, %s\n", key, n, k, m,
                 lt_row_bucket(m), std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 changed ? "a faster algorithm than the first heuristic" : "the first heuristic kept");
}

}  // namespace pagoda::cuda
