#include "pagoda/backend/cuda/kv_compact.h"

namespace pagoda::cuda {
namespace {

constexpr int kWarpsPerCta = 8;

// Bytes of one (slot, head) vector's codes in a pool of this format (bf16 when unquantized).
uint32_t code_bytes(int32_t head_dim, kernels::KvQuant q) {
  return q == kernels::KvQuant::kNone ? static_cast<uint32_t>(head_dim) * 2u
                                      : static_cast<uint32_t>(kernels::kv_head_data_bytes(head_dim, q));
}
uint32_t scale_bytes(int32_t head_dim, kernels::KvQuant q) {
  return q == kernels::KvQuant::kNone ? 0u : static_cast<uint32_t>(kernels::kv_scale_groups(head_dim, q)) * 4u;
}

// A warp copies n bytes (a multiple of 4: head_dim % 8 == 0, 4-byte scale records) in words.
__device__ void copy_words(char* base, uint64_t src, uint64_t dst, uint32_t n, int lane) {
  const uint32_t* s = reinterpret_cast<const uint32_t*>(base + src);
  uint32_t* d = reinterpret_cast<uint32_t*>(base + dst);
  for (uint32_t i = static_cast<uint32_t>(lane); i < n / 4; i += 32) d[i] = s[i];
}

__global__ void __launch_bounds__(kWarpsPerCta * 32)
    kv_move_vectors_kernel(DevicePagedKvLayer layer, const KvVectorMove* moves, int64_t count, uint32_t k_bytes,
                           uint32_t v_bytes, uint32_t k_scale_bytes, uint32_t v_scale_bytes) {
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (m >= count) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const KvVectorMove mv = moves[m];
  if (mv.head < 0) return;  // a skipped move (kv_build_moves_ragged): the destination stays a hole
  const uint64_t heads = static_cast<uint64_t>(layer.num_kv_heads);
  const uint64_t src_vector = static_cast<uint64_t>(mv.src_slot) * heads + static_cast<uint64_t>(mv.head);
  const uint64_t dst_vector = static_cast<uint64_t>(mv.dst_slot) * heads + static_cast<uint64_t>(mv.head);
  copy_words(static_cast<char*>(layer.key), src_vector * k_bytes, dst_vector * k_bytes, k_bytes, lane);
  if (layer.value != nullptr)
    copy_words(static_cast<char*>(layer.value), src_vector * v_bytes, dst_vector * v_bytes, v_bytes, lane);
  // Scale records: [blocks, heads, block_size] per vector (runtime/kv_quant.h, kv_scale_vector).
  const uint64_t bs = static_cast<uint64_t>(layer.block_size);
  auto scale_vector = [&](int64_t slot) {
    const uint64_t s = static_cast<uint64_t>(slot);
    return ((s / bs) * heads + static_cast<uint64_t>(mv.head)) * bs + s % bs;
  };
  if (layer.key_scale != nullptr && k_scale_bytes > 0)
    copy_words(static_cast<char*>(layer.key_scale), scale_vector(mv.src_slot) * k_scale_bytes,
               scale_vector(mv.dst_slot) * k_scale_bytes, k_scale_bytes, lane);
  if (layer.value_scale != nullptr && v_scale_bytes > 0)
    copy_words(static_cast<char*>(layer.value_scale), scale_vector(mv.src_slot) * v_scale_bytes,
               scale_vector(mv.dst_slot) * v_scale_bytes, v_scale_bytes, lane);
}

}  // namespace

cudaError_t kv_move_vectors(const DevicePagedKvLayer& layer, const KvVectorMove* moves, int64_t count,
                            cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((count + kWarpsPerCta - 1) / kWarpsPerCta);
  kv_move_vectors_kernel<<<grid, kWarpsPerCta * 32, 0, stream>>>(
      layer, moves, count, code_bytes(layer.head_dim, layer.key_dtype), code_bytes(layer.head_dim, layer.value_dtype),
      scale_bytes(layer.head_dim, layer.key_dtype), scale_bytes(layer.head_dim, layer.value_dtype));
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
