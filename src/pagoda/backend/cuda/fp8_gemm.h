#pragma once
// FP8 (e4m3) tensor-core GEMMs through cuBLASLt, with the scales fp8 weights
// and activations carry:
//
//   linear(): y bf16 [m, n] = (s_x[m] x s_w[n]) * (q_x [m, k] . q_w [n, k]^T),
//     per-token activation scales x per-output-channel weight scales (a
//     per-tensor weight scale is passed as n equal values), f32 accumulation.
//   linear_block128(): 128-column groups of the activations (one scale per
//     token and group, VEC128_32F) x 128x128 blocks of the weights
//     (BLK128x128_32F): the block-fp8 checkpoints' format (weight_block_size
//     [128, 128]).
//
// Scale modes (cuBLAS documents these for compute capability 9.0; chosen up
// front from the device, never by trying at run time):
//   kOuterVector: per-token x per-channel inside the GEMM
//     (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on A and B): sm_90.
//   kEpilogue: the GEMM runs with unit scales into an f32 scratch [m, n] and
//     fp8_apply_outer_scales applies both vectors and rounds to bf16: every
//     other FP8 device (8.9, 10.x, 12.x), and selectable for tests.
//   kMixed (sm_90's default): kEpilogue for m <= kEpilogueMaxRows, kOuterVector
//     above. On the H200 cuBLASLt's unit-scale kernels are faster for decode-
//     sized m (1-64 rows: 1.1-1.9x at the Llama-3-8B shapes) and its
//     outer-vector ones from 256 rows on (docs/BENCHMARKS.md, "FP8 GEMM").
//   The block mode exists on sm_90 only (block128_supported()).
// quantize_fp8_per_token (fp8_ops.h) produces the activations byte for byte as
// the CPU reference (model/fp8_matrix.h) rounds them.
//
// Requirements: k % 16 == 0, n % 16 == 0; the device must be sm_89 or newer
// (create() checks: an error names the device otherwise).
//
// Autotuning as gemm.h's, opt-in (PAGODA_GEMM_AUTOTUNE=1): the first eager call
// of a shape with m <= 512 times the top heuristics on its own buffers and keeps
// the fastest (synchronizes; skipped while capturing). Above 512 rows
// (prefill and mixed steps, m different every step) an LtLargeRowTuner tunes
// once per (scale kind, n, k, power-of-two row bucket) and reuses the result
// for every m of the bucket (cublaslt_plan.h). That part is opt-in
// (PAGODA_GEMM_AUTOTUNE_LARGE=1): on the H200 the tuning kept the first
// heuristic for the 8B shapes (docs/BENCHMARKS.md); off, large m takes the
// first heuristic.
//
// Thread safety: one Fp8Gemm per stream owner; plans are cached per shape, so
// after the first call of a shape a call only enqueues work. Graph capture:
// capture only shapes whose plan exists (an eager call made it) and, in
// kEpilogue mode, after reserve() or an eager call sized the f32 scratch.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cublaslt_plan.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/backend/cuda/fp8_ops.h"  // the quantization kernels
#include "pagoda/core/status.h"

namespace pagoda::cuda {

enum class Fp8ScaleMode { kOuterVector, kEpilogue, kMixed };

const char* fp8_scale_mode_name(Fp8ScaleMode mode);

// The mode create() picks for a device of compute capability major * 10 + minor.
Fp8ScaleMode default_fp8_scale_mode(int compute_capability);

// The block layouts of linear_block128's scales.
int32_t fp8_block_groups(int32_t k);                  // ceil(k / 128)
int32_t fp8_block_padded_rows(int32_t m);             // round_up(m, 4): rows the block GEMM runs on
int32_t fp8_block_weight_scale_stride(int32_t k);     // round_up(ceil(k / 128), 4)

class Fp8Gemm {
 public:
  // mode: nullopt picks default_fp8_scale_mode for the current device.
  // Errors: no FP8 tensor cores on the current device (compute capability < 8.9);
  // kOuterVector or kMixed asked on a device other than sm_90.
  static StatusOr<std::unique_ptr<Fp8Gemm>> create(std::optional<Fp8ScaleMode> mode = std::nullopt,
                                                    size_t workspace_bytes = 32ull << 20);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  static constexpr int32_t kEpilogueMaxRows = 64;  // kMixed's switch

  Fp8ScaleMode mode() const { return mode_; }
  bool block128_supported() const { return compute_capability_ == 90; }

  // Sizes the f32 scratch of the unit-scale path for max_m x max_n outputs (kMixed: at most
  // kEpilogueMaxRows rows; kOuterVector: none); eager only.
  Status reserve(int32_t max_m, int32_t max_n);

  // y [m, n] bf16 = diag(x_scales) (x [m, k] . w [n, k]^T) diag(w_scales); x, w fp8 e4m3 row-major;
  // x_scales [m], w_scales [n] f32 on the device. m may be 0. Errors: shapes cuBLASLt cannot run.
  Status linear(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream);

  // Block scales (sm_90): the GEMM runs on p = fp8_block_padded_rows(m) rows, so x and y must hold p rows
  // (quantize_fp8_per_token_group128 with padded_m = p zeroes the extra ones; the extra rows of y are
  // written and meaningless). x_scales [fp8_block_groups(k)][p] (token fastest); w_scales
  // [ceil(n / 128)][fp8_block_weight_scale_stride(k)] (k-block fastest, padding unused). Both 16-byte aligned.
  Status linear_block128(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                         int32_t n, int32_t k, __nv_bfloat16* y, cudaStream_t stream);

  // f32 output, the same arithmetic as linear() without its bf16 rounding: y f32 [m, n] = diag(x_scales)
  // (x . w^T) diag(w_scales) through the outer-vector scales (for the lm_head's logits at many rows).
  // Errors: kUnimplemented when the device has no outer-vector scales (mode kEpilogue) or cuBLASLt offers
  // no algorithm for the shape; the caller keeps another path then.
  Status linear_f32(const uint8_t* x, const float* x_scales, int32_t m, const uint8_t* w, const float* w_scales,
                    int32_t n, int32_t k, float* y, cudaStream_t stream);

  // Whether cuBLASLt's heuristic offers an algorithm for e4m3 x e4m3 -> bf16 with these cuBLASLt scale
  // modes (cublasLtMatmulMatrixScale_t values) on the weight (A) and activation (B) operands at this
  // shape, and its status: the probe behind the mode table in docs/CPU_QUANT.md.
  struct Acceptance {
    bool accepted = false;
    int status = 0;  // cublasStatus_t of the heuristic (or of the attribute that failed)
  };
  Acceptance probe(int32_t weight_mode, int32_t activation_mode, int32_t m, int32_t n, int32_t k);

  // Autotuning switches (create() reads PAGODA_GEMM_AUTOTUNE / PAGODA_GEMM_AUTOTUNE_LARGE); they apply to
  // plans made afterwards. For tests and benchmarks that compare tuned and untuned GEMMs in one process.
  void set_autotune(bool small_m, bool large_m) {
    autotune_ = small_m;
    autotune_large_ = large_m;
  }
  bool autotune_large() const { return autotune_large_; }
  const LtLargeRowTuner::Stats& large_m_tuning() const { return large_tuner_.stats(); }

 private:
  enum class Kind { kOuterVector, kUnitScales, kBlock128, kOuterVectorF32 };
  struct Plan : LtMatmulPlan {
    bool tuned = false;  // autotune ran (or was skipped for good)
    Kind kind = Kind::kOuterVector;
    int32_t n = 0, k = 0;
  };
  static constexpr int32_t kMaxTunedRows = 512;
  static constexpr int kTunedCandidates = 8;
  Fp8Gemm() = default;
  StatusOr<Plan*> plan_for(Kind kind, int32_t m, int32_t n, int32_t k, const float* x_scales,
                                   const float* w_scales);
  // Builds a plan; on failure returns the cuBLAS status (plan destroyed).
  cublasStatus_t make_plan(int32_t weight_mode, int32_t activation_mode, bool f32_output, int32_t m, int32_t n,
                           int32_t k, const float* x_scales, const float* w_scales, LtMatmulPlan& plan);
  Status set_scale_pointers(LtMatmulPlan& plan, const float* x_scales, const float* w_scales);
  // Autotunes plan on first eager use (see above), then enqueues the GEMM into y.
  Status run(Plan& plan, int32_t m, const uint8_t* x, const uint8_t* w, void* y, cudaStream_t stream);

  Fp8ScaleMode mode_ = Fp8ScaleMode::kEpilogue;
  int compute_capability_ = 0;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer scratch_;  // f32 [m, n] of kEpilogue; grows on eager calls only
  bool autotune_ = true;
  bool autotune_large_ = true;
  LtLargeRowTuner large_tuner_;
  std::map<std::tuple<int, int32_t, int32_t, int32_t>, Plan> plans_;
};

}  // namespace pagoda::cuda
