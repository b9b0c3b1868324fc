#pragma once
// Reads one (slot, head) vector of a paged K or V pool as f32, for the CPU
// attention kernels (paged_attention.cpp's per-position reference and
// paged_attention_tiled.cpp's tiles). f32 pools are read in place; every
// other dtype is dequantized into the caller's buffer with
// dequantize_kv_vector, so attention over a quantized pool is attention over
// the dequantized values, by construction.
//
// Thread safety: the reader holds only the pool pointers and the layer's
// shape; read() is const and writes only the caller's buffer, so one reader
// may serve many threads, each with its own buffer.

#include <cstddef>
#include <cstdint>

#include "pagoda/backend/cpu/kernels/kv_quantize.h"
#include "pagoda/backend/cpu/kernels/paged_kv.h"
#include "pagoda/core/dtype.h"

namespace pagoda::kernels {

class KvVectorReader {
 public:
  // data / scales: the layer's key or value pool and its scale pool (null for
  // f32 / f16 / bf16), stored as dtype with layer's shape (paged_kv.h).
  KvVectorReader(const void* data, const void* scales, DType dtype, const PagedKvLayer& layer)
      : data_(static_cast<const std::byte*>(data)),
        scales_(static_cast<const std::byte*>(scales)),
        dtype_(dtype),
        head_dim_(layer.head_dim),
        num_kv_heads_(layer.num_kv_heads),
        block_size_(layer.block_size),
        head_bytes_(kv_head_bytes(layer.head_dim, dtype)),
        scale_bytes_(kv_head_scale_bytes(layer.head_dim, dtype)) {}

  // The head_dim f32 values of (slot, kv_head): a pointer into the pool for
  // f32, else buffer (head_dim floats) after dequantizing into it.
  const float* read(int64_t slot, int32_t kv_head, float* buffer) const {
    const size_t vector = static_cast<size_t>(slot) * static_cast<size_t>(num_kv_heads_) + static_cast<size_t>(kv_head);
    if (dtype_ == DType::kF32) return reinterpret_cast<const float*>(data_ + vector * head_bytes_);
    const std::byte* scales =
        scales_ != nullptr ? scales_ + kv_scale_vector(slot, kv_head, block_size_, num_kv_heads_) * scale_bytes_ : nullptr;
    dequantize_kv_vector(data_ + vector * head_bytes_, scales, head_dim_, dtype_, buffer);
    return buffer;
  }

  // The stored bytes of (slot, kv_head), as they are (f32 / f16 / bf16 pools:
  // the head_dim elements), for kernels that widen in registers.
  const void* vector_data(int64_t slot, int32_t kv_head) const {
    const size_t vector = static_cast<size_t>(slot) * static_cast<size_t>(num_kv_heads_) + static_cast<size_t>(kv_head);
    return data_ + vector * head_bytes_;
  }
  DType dtype() const { return dtype_; }

  // Asks the memory system for (slot, kv_head)'s bytes ahead of read(): attention
  // walks one head's vectors, num_kv_heads vectors apart, and without prefetches
  // the decode loop waited on each vector's first load (the loop is latency
  // bound, not bandwidth bound). A hint only: no effect on results.
  void prefetch(int64_t slot, int32_t kv_head) const {
    const size_t vector = static_cast<size_t>(slot) * static_cast<size_t>(num_kv_heads_) + static_cast<size_t>(kv_head);
    const std::byte* p = data_ + vector * head_bytes_;
    for (size_t off = 0; off < head_bytes_; off += 64) __builtin_prefetch(p + off, 0, 3);
    if (scales_ != nullptr)
      __builtin_prefetch(scales_ + kv_scale_vector(slot, kv_head, block_size_, num_kv_heads_) * scale_bytes_, 0, 3);
  }

 private:
  const std::byte* data_;
  const std::byte* scales_;
  DType dtype_;
  int32_t head_dim_;
  int32_t num_kv_heads_;
  int32_t block_size_;
  size_t head_bytes_;
  size_t scale_bytes_;
};

}  // namespace pagoda::kernels
