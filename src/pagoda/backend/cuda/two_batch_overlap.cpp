#include "pagoda/backend/cuda/two_batch_overlap.h"

#include <algorithm>
#include <utility>

#include "pagoda/backend/cuda/cuda_check.h"

namespace pagoda::cuda {

StatusOr<std::unique_ptr<TwoBatchOverlap>> TwoBatchOverlap::create(int32_t min_bucket, bool fp8,
                                                                   int32_t fp8_reserve_rows, int32_t fp8_reserve_width,
                                                                   DType kv_key, DType kv_value) {
  if (min_bucket < kTwoBatchSmallestBucket)
    return invalid_argument_error("two-batch overlap: min bucket {} (at least {})", min_bucket,
                                  kTwoBatchSmallestBucket);
  std::unique_ptr<TwoBatchOverlap> o(new TwoBatchOverlap());
  o->min_bucket_ = min_bucket;
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&o->stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&o->fork_, &o->join_, &o->a_done_, &o->b_done_})
    PAGODA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  o->attention_ = std::make_unique<FastAttention>();
  o->attention_->set_kv_dtypes(kv_key, kv_value);
  PAGODA_ASSIGN_OR_RETURN(o->gemm_, Gemm::create());
  if (fp8) {
    PAGODA_ASSIGN_OR_RETURN(o->fp8_gemm_, Fp8Gemm::create());
    PAGODA_RETURN_IF_ERROR(o->fp8_gemm_->reserve(fp8_reserve_rows, fp8_reserve_width));
  }
  return o;
}

TwoBatchOverlap::~TwoBatchOverlap() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : {fork_, join_, a_done_, b_done_})
    if (e != nullptr) cudaEventDestroy(e);
}

StatusOr<bool> TwoBatchOverlap::plan_graph(FastAttention& first, const ModelConfig& config, const ForwardBatch& batch,
                                           int32_t bucket, int32_t max_bucket, int32_t block_table_stride,
                                           int32_t block_size, int32_t num_blocks, cudaStream_t stream,
                                           const int32_t* device_block_tables) {
  const int32_t rows_a = first_half_rows(bucket);
  const auto n = static_cast<int32_t>(batch.sequences.size());
  if (bucket < min_bucket_ || n <= rows_a) return false;
  // The plans see the sequences only (graph mode: query row i = sequence i of the plan's batch).
  half_.sequences.assign(batch.sequences.begin(), batch.sequences.begin() + rows_a);
  PAGODA_ASSIGN_OR_RETURN(const bool a, first.plan_graph(config, half_, rows_a, max_bucket, block_table_stride,
                                                         block_size, num_blocks, stream, device_block_tables));
  if (!a) return false;
  half_.sequences.assign(batch.sequences.begin() + rows_a, batch.sequences.end());
  const int32_t* b_tables =
      device_block_tables != nullptr ? device_block_tables + static_cast<size_t>(rows_a) * block_table_stride : nullptr;
  return attention_->plan_graph(config, half_, bucket - rows_a, max_bucket, block_table_stride, block_size,
                                num_blocks, stream, b_tables);
}

Status TwoBatchOverlap::fork(cudaStream_t main) {
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, main));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, fork_, 0));
  return ok_status();
}

Status TwoBatchOverlap::join(cudaStream_t main) {
  PAGODA_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_, stream_));
  PAGODA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, join_, 0));
  return ok_status();
}

}  // namespace pagoda::cuda
