#pragma once
// The flat, plain-old-data descriptor that the paged attention kernels take by
// value. It is built on the host once per step by PagedAttentionPlan
// (attention_plan.h) and holds only device pointers and sizes, so a launch
// needs no allocation and no host synchronization and can be captured in a
// CUDA graph. This header is included by .cu files: no std:: types.
//
// KV layout (shared with the CPU pool, backend/cpu/cpu_kv_pool.h): per layer, K and
// V are each [num_blocks, block_size, num_kv_heads, head_dim]; the vector of
// (block b, slot s, kv head h) starts at element
//   b * block_stride + s * token_stride + h * head_dim.
// Position p of sequence i lives in block block_tables[block_table_start[i] +
// p / block_size], slot p % block_size.
//
// Queries and outputs: [num_tokens, num_q_heads, head_dim] bf16, rows grouped by
// sequence; sequence i owns rows [query_start[i], query_start[i + 1]). Its new
// token j (0-based) sits at position kv_length[i] - num_new + j and attends to
// positions [0, that] (causal; the cached prefix may end mid-block).

#include <cstdint>

namespace pagoda::kernels::cuda {

// Element type of a KV pool: bf16, or a quantized format of runtime/kv_quant.h
// (the same numbering as KvQuant, kBF16 = KvQuant::kNone), dequantized in
// registers with the scale pools. Quantized pools run in the decode kernel only.
enum class KvElement : int32_t { kBF16 = 0, kFP8E4M3 = 1, kInt8 = 2, kInt4 = 3 };

enum class AttentionKernel : int32_t {
  kDecode = 0,   // one new token per sequence: split-K decode + merge
  kPrefill = 1,  // any number of new tokens per sequence: tensor-core tiles (mma.sync)
  kPrefillSm90 = 2,  // the same work list on Hopper's wgmma (head_dim 128, sm_90a)
};

struct AttentionDescriptor {
  AttentionKernel kernel = AttentionKernel::kPrefill;

  // Shapes.
  int32_t num_sequences = 0;
  int32_t num_tokens = 0;    // rows of q / out
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // divides num_q_heads
  int32_t head_dim = 0;      // 64, 128 (decode also 256)
  int32_t block_size = 0;    // power of two: 8, 16, 32, 64 (any power of two up to 256 works)
  int32_t log2_block_size = 0;
  float scale = 0.0f;        // softmax scale on q.k (usually 1/sqrt(head_dim))
  float scale_log2 = 0.0f;   // scale * log2(e): the kernels use exp2

  // Per-sequence arrays (device, int32).
  const int32_t* query_start = nullptr;        // [num_sequences + 1]
  const int32_t* kv_length = nullptr;          // [num_sequences]: cached + new
  const int32_t* block_table_start = nullptr;  // [num_sequences + 1]
  const int32_t* block_tables = nullptr;       // [block_table_start[num_sequences]]

  // Work list (device, int32), one CTA row per item.
  //   decode:  items of 3 ints (sequence, kv_begin, kv_end): one split of one sequence.
  //   prefill: items of 2 ints (sequence, first new token of the tile), heaviest first.
  const int32_t* work_items = nullptr;
  int32_t num_work_items = 0;
  // decode: split_start[i]..split_start[i+1] are sequence i's items; the merge
  // pass combines them when there is more than one.
  const int32_t* split_start = nullptr;  // [num_sequences + 1]
  int32_t max_splits = 1;
  int32_t q_heads_per_cta = 1;   // decode: query heads of one GQA group per CTA (1, 2, 4)
  int32_t tokens_per_tile = 0;   // prefill: new tokens per 128-row tile (128 / group size)

  // The KV pool of one layer (device). bf16: element strides below. Quantized
  // (kv_quant.h): vector (block b, slot s, head h) is number
  // (b * block_size + s) * num_kv_heads + h, its codes at that times
  // kv_head_data_bytes, its 4-byte scale records at that times kv_scale_groups.
  KvElement key_element = KvElement::kBF16;
  KvElement value_element = KvElement::kBF16;
  const void* key = nullptr;
  const void* value = nullptr;
  int64_t block_stride = 0;  // elements (bf16)
  int64_t token_stride = 0;  // elements (bf16)
  const void* key_scale = nullptr;    // scale records; null for bf16
  const void* value_scale = nullptr;
  // fp8 pools quantized with one scale per tensor (a checkpoint's calibrated
  // k_scale / v_scale; kv_write's fixed scales), when both are > 0: the
  // tensor-core decode then reads these instead of the records, which may be
  // null for it (the CUDA-core and naive kernels read the records, which hold
  // the same values). 0: per-vector scales, from the records.
  float key_tensor_scale = 0.0f;
  float value_tensor_scale = 0.0f;
  // Decode: bf16 / fp8 / int8 pools at head_dim 64 / 128 run on tensor cores
  // unless this is set (the CUDA-core loops, for comparisons).
  bool decode_cuda_cores = false;

  // Per-head holes of token eviction's per-head budgets (docs/KV_CACHE.md
  // "Per-head lengths"; device, int32; null: none): KV head h of sequence i
  // does not attend positions [hole_begin[i * num_kv_heads + h], hole_end[i])
  // of this layer (its compacted region's slots past its kept tokens), which
  // are never read. Only the CUDA-core decode kernels (bf16 and quantized)
  // honour them: launch_paged_attention routes a decode with holes there and
  // refuses (cudaErrorInvalidValue) a prefill with holes.
  const int32_t* hole_begin = nullptr;  // [num_sequences * num_kv_heads]
  const int32_t* hole_end = nullptr;    // [num_sequences]; hole_begin <= hole_end

  // Per-position scores for token eviction's attention mass (docs/KV_CACHE.md
  // "Mass from the decode kernel"; device, f32; null: off, and nothing is
  // written). The decode kernels write it (tensor cores and CUDA cores, every
  // KV format; the prefill kernels refuse it): the score of query row r, query
  // head h at position pos, in log2 units (q.k * scale_log2, as the kernel
  // computed it), goes to scores[(r * num_q_heads + h) * score_stride + pos]
  // for every position the row attends (holes excepted); other positions are
  // left as they were. Callers check decode_attention_writes_scores first;
  // kv_attention_mass_from_scores turns the rows into mass and entropy.
  float* scores = nullptr;
  int64_t score_stride = 0;

  // Split-K workspace (device, fp32), workspace_bytes() of the plan:
  // partial outputs [num_work_items, num_q_heads, head_dim] then log2-sum-exp
  // [num_work_items, num_q_heads].
  float* workspace = nullptr;
};

}  // namespace pagoda::kernels::cuda
