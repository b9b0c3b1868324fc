#pragma once
// The tensor-core MLA prefill of the DeepSeek forward: a step's prompt rows
// attend over per-head K / V decompressed from the paged latent, with every
// product on cuBLAS's tensor-core GEMMs instead of mla_attention_simple's
// f32 loops. Per prompt segment (one sequence's new rows, after any cached
// prefix: context C = cached + new):
//
//   latent [C, rank + rope] = the sequence's cached vectors, gathered from the
//                             paged pool as bf16 (mla_gather_latent; fp8 and the
//                             other formats are dequantized on the way)
//   kv [C, heads, nope + v] = latent[:, :rank] x kv_b_proj^T      (one GEMM)
//   per chunk of query rows, per head (strided batched over the heads):
//     S  = q_nope . k_nope^T + q_pe . k_rope^T    f32, keys up to the chunk's last
//                                                 position (two GEMMs: 128 + 64 dims
//                                                 for DeepSeek, k_rope shared by heads)
//     P  = causal softmax(S * scale)              bf16 (mla_causal_softmax)
//     O  = P . V                                  bf16, straight into the per-head
//                                                 output rows that feed o_proj
//
// so the prompt rows skip the absorbed attention and W_UV. Query chunks keep
// S and P within a fixed scratch budget. The same math as the absorbed form;
// K / V and P are rounded to bf16 (the simple kernel keeps f32), so results
// agree within bf16 rounding.
//
// Which rows: the step's rows from the first sequence (at or after
// `first_row`, the rows the fast decode kernel took) with at least
// `min_rows` new tokens to the end; rows before it stay on the decode /
// simple kernels. Decompressing a sequence's whole context costs about as
// much as the absorbed form of a dozen query rows on CUDA cores, so short
// segments (decodes, small chunks) keep the absorbed form, whose latent is
// never rounded again. Eager steps only (scratch grows on the host in plan()).
//
// Thread safety: one caller at a time (owned by a CudaDeepseekForward).

#include <cstdint>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "pagoda/backend/cuda/cuda_ops.h"
#include "pagoda/backend/cuda/device_buffer.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/forward_batch.h"

namespace pagoda::cuda {

class CudaMlaPrefill {
 public:
  // config.mla set; the softmax scale comes from it (yarn's mscale included).
  explicit CudaMlaPrefill(const ModelConfig& config);

  // score_budget_bytes: scores (f32) plus probabilities (bf16) of one query
  // chunk stay within it (at least one query row per chunk). min_rows: the
  // first prefill segment's least new rows. Tests change both.
  struct Tuning {
    size_t score_budget_bytes = size_t{256} << 20;
    int32_t min_rows = 32;
  };
  void set_tuning(const Tuning& tuning) { tuning_ = tuning; }

  // Chooses the step's prefill rows (see above) and grows the scratch for
  // them. Returns the first prefill row, batch.num_tokens() when none.
  StatusOr<int32_t> plan(const ForwardBatch& batch, int32_t first_row);

  // The planned rows of one layer. q: the query rows [T, heads, nope + rope]
  // (q_nope read from here); q_absorbed [T, heads, rank + rope] (the rotated
  // q_pe read from its last rope columns); block_tables [sequences, stride]
  // (device, the step's); kv_b_proj [heads * (nope + v), rank]; heads_out
  // [T, heads * v] receives the planned rows.
  Status run(cublasHandle_t cublas, const DevicePagedKvLayer& layer, const int32_t* block_tables,
             int32_t block_table_stride, const bf16* q, const bf16* q_absorbed, const bf16* kv_b_proj,
             bf16* heads_out, cudaStream_t stream);

 private:
  struct Segment {
    int32_t row = 0;       // first new row in the step
    int32_t rows = 0;      // new rows
    int32_t context = 0;   // cached + new keys
    int32_t sequence = 0;  // the block table row
    int32_t chunk = 0;     // query rows per chunk
  };
  int32_t heads_, nope_, rope_, rank_, v_;
  float scale_;
  Tuning tuning_;
  std::vector<Segment> segments_;
  DeviceBuffer latent_, kv_, scores_, probs_;
};

}  // namespace pagoda::cuda
