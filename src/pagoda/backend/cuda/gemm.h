#pragma once
// bf16 GEMMs through cuBLASLt with f32 accumulation: the linear layer
// y[m, n] = x[m, k] · w[n, k]^T, weights stored as PyTorch's nn.Linear does
// (row-major [out_features, in_features]). Output bf16 (activations) or f32
// (logits). The matmul descriptor and the heuristic's algorithm are cached per
// shape, so after the first call of a shape a call only enqueues work, which
// makes it CUDA-graph capturable (the workspace is owned here, fixed address).
//
// Autotuning (opt-in, PAGODA_GEMM_AUTOTUNE=1; off, every shape takes cuBLASLt's
// first heuristic: measured faster inside the engine, cublaslt_plan.h
// lt_autotune_switches): the first call of a shape with m <= kMaxTunedRows
// times the top kTunedCandidates heuristics on the call's own buffers and keeps
// the fastest; that call synchronizes the stream (never while it is being
// captured: then the first heuristic stays). Larger m: one tuning per (output
// type, n, k, power-of-two row bucket), reused for every m of the bucket
// (LtLargeRowTuner, cublaslt_plan.h); opt-in with PAGODA_GEMM_AUTOTUNE_LARGE=1.
//
// Thread safety: one Gemm per stream owner; calls are not synchronized.

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include <cublasLt.h>
#include <cuda_bf16.h>

#include "pagoda/backend/cuda/cublaslt_plan.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/status.h"

namespace pagoda::cuda {

enum class GemmOutput { kBF16, kF32 };

class Gemm {
 public:
  static constexpr int32_t kMaxTunedRows = 512;
  static constexpr int kTunedCandidates = 8;

  static StatusOr<std::unique_ptr<Gemm>> create(size_t workspace_bytes = 32ull << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y (bf16 or f32 per `output`) [m, n] = x [m, k] · w [n, k]^T, all row-major,
  // contiguous. m may be 0 (nothing happens).
  Status linear(const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, int32_t n, int32_t k, void* y,
                GemmOutput output, cudaStream_t stream);

  // As Fp8Gemm's: the autotuning switches for plans made afterwards, and the large-m tuner's counts.
  void set_autotune(bool small_m, bool large_m) {
    autotune_ = small_m;
    autotune_large_ = large_m;
  }
  const LtLargeRowTuner::Stats& large_m_tuning() const { return large_tuner_.stats(); }

 private:
  struct Plan : LtMatmulPlan {
    bool tuned = false;  // autotune ran (or was skipped for good)
    int32_t n = 0, k = 0;
    int output = 0;
  };
  Gemm() = default;
  StatusOr<Plan*> plan_for(int32_t m, int32_t n, int32_t k, GemmOutput output);
  // Times the top heuristics for this shape on these buffers; keeps the fastest in plan.algo.
  Status autotune(Plan& plan, const __nv_bfloat16* x, int32_t m, const __nv_bfloat16* w, void* y,
                  cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  bool autotune_ = true;
  bool autotune_large_ = true;
  LtLargeRowTuner large_tuner_;
  DeviceBuffer workspace_;
  std::map<std::tuple<int32_t, int32_t, int32_t, int>, Plan> plans_;
};

}  // namespace pagoda::cuda
