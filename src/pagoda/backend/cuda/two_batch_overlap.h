#pragma once
// Two-batch overlap for large decode steps. A decode step at a few hundred sequences spends most of its
// time in two kinds of kernels that use different parts of the GPU: the attention streams the KV cache
// (HBM-bound, tensor cores idle) and the projections are GEMMs (tensor-core bound, HBM mostly idle).
// Run in one stream they take turns. Here the step's rows are split into two halves that run the layer
// loop on two streams, and the halves' attentions take turns (half A's attention of layer l, then half
// B's, then A's of layer l + 1, ...): while one half's attention streams its KV, the other half runs its
// output projection, MLP and next QKV projection. SGLang's two-batch overlap and DeepSeek's dual
// micro-batches use the same split to hide the MoE all-to-all; here what is hidden is the GEMMs behind
// the KV reads (or the reverse).
//
// This object owns the second half's resources: its stream, its own attention plan (a FastAttention
// with its own arena and split-K workspace, since the halves' plans differ and run concurrently), its
// own GEMM objects (cuBLASLt workspaces must not be shared by concurrent GEMMs), and the events that
// fork, order and join the halves. The first half uses the model's own.
//
// Only CUDA-graph decode steps of at least min_bucket rows split (the halves are fixed at capture:
// rows [0, bucket / 2) and [bucket / 2, bucket), so every bucket of 128 or more keeps both non-empty,
// decode_graph_buckets' spacing); the model falls back to one lane when either half's plan is not
// supported. PAGODA_TWO_BATCH_OVERLAP=<min bucket> turns it on (0: off).
//
// Thread safety: one caller (the owning CudaModel).

#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/fast_attention.h"
#include "pagoda/backend/cuda/fp8_gemm.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/forward_batch.h"

namespace pagoda::cuda {

// The smallest bucket that may split: its sequence count (more than the previous bucket's) keeps half B
// non-empty (decode_graph_buckets: every bucket >= 128 is at most 32 above the previous one).
inline constexpr int32_t kTwoBatchSmallestBucket = 128;

class TwoBatchOverlap {
 public:
  // min_bucket >= kTwoBatchSmallestBucket; fp8: the model has fp8 projections (a second Fp8Gemm).
  // fp8_reserve_rows / fp8_reserve_width: Fp8Gemm::reserve's arguments for the model.
  // kv_key / kv_value: the pool's element types (FastAttention::set_kv_dtypes).
  static StatusOr<std::unique_ptr<TwoBatchOverlap>> create(int32_t min_bucket, bool fp8, int32_t fp8_reserve_rows,
                                                           int32_t fp8_reserve_width, DType kv_key, DType kv_value);
  ~TwoBatchOverlap();
  TwoBatchOverlap(const TwoBatchOverlap&) = delete;
  TwoBatchOverlap& operator=(const TwoBatchOverlap&) = delete;

  int32_t min_bucket() const { return min_bucket_; }
  // Rows of half A in a bucket (half B: the rest).
  static int32_t first_half_rows(int32_t bucket) { return bucket / 2; }

  // Plans a graph decode step of `bucket` rows as two halves: half A's sequences (the first
  // first_half_rows(bucket)) on `first` (the model's attention), half B's on this object's. false: the
  // bucket is below min_bucket, half B would be empty, or either plan is not supported (the caller then
  // plans the step whole). The arena copies are enqueued on `stream`. device_block_tables: the step's
  // tables on the device (FastAttention::plan_graph), row i = batch sequence i; half B's plan reads them
  // from its first sequence's row on. Null: each plan's arena carries its half's tables.
  StatusOr<bool> plan_graph(FastAttention& first, const ModelConfig& config, const ForwardBatch& batch,
                            int32_t bucket, int32_t max_bucket, int32_t block_table_stride, int32_t block_size,
                            int32_t num_blocks, cudaStream_t stream, const int32_t* device_block_tables = nullptr);

  cudaStream_t stream() const { return stream_; }
  FastAttention& attention() { return *attention_; }
  Gemm& gemm() { return *gemm_; }
  Fp8Gemm* fp8_gemm() { return fp8_gemm_.get(); }

  // Half B's stream starts after everything enqueued on `main` so far.
  Status fork(cudaStream_t main);
  // `main` continues after everything enqueued on half B's stream so far.
  Status join(cudaStream_t main);
  // The attention turn events: half A's attention of layer l waits for half B's of layer l - 1
  // (b_done), half B's waits for half A's of layer l (a_done).
  cudaEvent_t a_done() const { return a_done_; }
  cudaEvent_t b_done() const { return b_done_; }

 private:
  TwoBatchOverlap() = default;
  int32_t min_bucket_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr, a_done_ = nullptr, b_done_ = nullptr;
  std::unique_ptr<FastAttention> attention_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Fp8Gemm> fp8_gemm_;
  ForwardBatch half_;  // scratch: one half's sequences
};

}  // namespace pagoda::cuda
