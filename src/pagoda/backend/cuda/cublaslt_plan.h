#pragma once
// What the bf16 (gemm.h) and fp8 (fp8_gemm.h) cuBLASLt wrappers share: a
// matmul plan (descriptor, the A/B/C layouts and the chosen algorithm), its
// teardown, and the heuristic query with a workspace cap.
//
// Thread safety: a plan belongs to one owner; nothing here is synchronized.

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

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
// (D = C = d, alpha 1, beta 0; each run `runs` times after one warm-up) and keeps
// the fastest in plan.algo. Synchronizes the stream. Returns the cuBLAS status of
// the heuristic query; algorithms that fail to run are skipped.
cublasStatus_t lt_autotune(cublasLtHandle_t handle, LtMatmulPlan& plan, const void* a, const void* b, void* d,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream, int candidates,
                           int runs = 5);

// The autotuning switches the bf16 and fp8 wrappers read at create(), both off by default:
// PAGODA_GEMM_AUTOTUNE=1 times the top heuristics of each m <= 512 shape (lt_autotune), and
// PAGODA_GEMM_AUTOTUNE_LARGE=1 the large-m buckets (LtLargeRowTuner). Small-m tuning was on by default
// until an H100 measured it slower inside the engine's steps at every batch tried (the algorithm that won
// the back-to-back timing ran slower in the captured step: batch-64 and batch-250/470 decode steps 1-15%
// slower, docs/BENCHMARKS.md "cuBLASLt's small-m autotuning: off by default").
struct LtAutotuneSwitches {
  bool small_m = false;
  bool large_m = false;
};
LtAutotuneSwitches lt_autotune_switches();

// Whether algo (found for another m of the same n, k and types) is valid for
// plan's descriptor and layouts (cublasLtMatmulAlgoCheck: cuBLASLt's algorithm
// configurations are not tied to a problem size, but a configuration can be
// rejected for one, e.g. a split-K whose workspace grows with m) and needs at
// most workspace_bytes.
bool lt_algo_fits(cublasLtHandle_t handle, const LtMatmulPlan& plan, const cublasLtMatmulAlgo_t& algo,
                  size_t workspace_bytes);

// Rows bucket of the large-m autotuning: the smallest power of two >= m.
int32_t lt_row_bucket(int32_t m);

// Autotuning for large m (prefill and mixed steps, whose m differs from step to
// step): one tuning per (shape key, n, k, row bucket), on the first eager call
// whose m falls in the bucket (that call's own buffers), and the tuned
// algorithm reused by every later plan of the bucket that lt_algo_fits accepts
// (else that plan keeps its first heuristic). Costs one tuning per layer shape
// and bucket per process (kCandidates x (1 + kRuns) GEMMs of that size).
class LtLargeRowTuner {
 public:
  static constexpr int kCandidates = 16;
  static constexpr int kRuns = 3;
  struct Stats {
    int tuned = 0;       // buckets tuned
    int reused = 0;      // plans that took their bucket's algorithm
    int rejected = 0;    // plans whose bucket's algorithm cuBLASLt rejected (first heuristic kept)
    int changed = 0;     // tunings whose fastest was not the first heuristic
    double tune_ms = 0;  // host wall time of the tunings (incl. their synchronization)
  };
  // plan was just made for this m (its algo the first heuristic); key names the operand types / scale kind.
  void apply(cublasLtHandle_t handle, LtMatmulPlan& plan, int key, int32_t m, int32_t n, int32_t k, const void* a,
             const void* b, void* d, void* workspace, size_t workspace_bytes, cudaStream_t stream);
  const Stats& stats() const { return stats_; }

 private:
  std::map<std::tuple<int, int32_t, int32_t, int32_t>, cublasLtMatmulAlgo_t> algos_;
  Stats stats_;
};

}  // namespace pagoda::cuda
