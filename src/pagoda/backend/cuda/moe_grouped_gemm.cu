// The MoE expert GEMMs with the per-expert row ranges read on the device
// (mla_ops.h, moe_grouped_gemm): no host synchronization, so a DeepSeek decode
// step can be captured in a CUDA graph.
//
// One CTA of 4 warps per (64-column tile of n, expert). A CTA whose expert has
// no rows exits at once; the others walk their expert's rows in chunks of 64,
// and for each chunk stream the weight tile [64 x k] through shared memory in
// steps of 128 along k, so at decode sizes (a chunk or two per expert) every
// active expert's weights are read about once: the kernel is bound by weight
// bandwidth, as a decode step should be. bf16 tensor cores (WMMA 16x16x16,
// f32 accumulation); the next k-step's global loads are issued into registers
// before the current step's MMAs, so loads overlap the math. Rows past the
// expert's range, columns past n and k past its end are zero-filled.

#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>

#include "pagoda/backend/cuda/mla_ops.h"

namespace pagoda::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsTile = 64;  // expert rows per chunk (16 per MMA row block, 4 blocks)
constexpr int kColsTile = 64;  // output columns per CTA (16 per warp)
constexpr int kKStep = 128;  // 16 KB of weights per CTA and step in flight
constexpr int kRowChunks = kKStep / 8;  // 16-byte chunks of a tile row
constexpr int kPad = 8;        // bf16 padding of a shared row (bank conflicts; keeps 16-byte alignment)
constexpr int kLd = kKStep + kPad;
constexpr int kChunksA = kRowsTile * kKStep / 8 / kThreads;  // 16-byte chunks per thread
constexpr int kChunksB = kColsTile * kKStep / 8 / kThreads;
constexpr int kTilesBytes = (kRowsTile + kColsTile) * kLd * 2;
constexpr int kOutBytes = kRowsTile * (kColsTile + 4) * 4;
constexpr int kSmemBytes = kTilesBytes > kOutBytes ? kTilesBytes : kOutBytes;
static_assert(kSmemBytes <= 48 * 1024, "static shared memory");

__global__ void __launch_bounds__(kThreads) moe_grouped_gemm_kernel(const int32_t* __restrict__ offsets,
                                                                    const __nv_bfloat16* __restrict__ x,
                                                                    const __nv_bfloat16* __restrict__ w, int32_t n,
                                                                    int32_t k, __nv_bfloat16* __restrict__ y) {
  using namespace nvcuda;
  const int expert = blockIdx.y;
  const int begin = offsets[expert], end = offsets[expert + 1];
  if (end <= begin) return;
  // A and B tiles during the k loop; the f32 output tile reuses their bytes afterwards.
  __shared__ __align__(128) uint8_t smem[kSmemBytes];
  __nv_bfloat16* a_tile = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* b_tile = a_tile + kRowsTile * kLd;
  float* c_tile = reinterpret_cast<float*>(smem);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int n0 = blockIdx.x * kColsTile;
  const __nv_bfloat16* we = w + static_cast<int64_t>(expert) * n * k;

  for (int m0 = begin; m0 < end; m0 += kRowsTile) {
    uint4 ra[kChunksA], rb[kChunksB];
    // Global -> registers for the k-step at k0 (zeros outside the matrices).
    auto load = [&](int k0) {
#pragma unroll
      for (int i = 0; i < kChunksA; ++i) {
        const int idx = tid + i * kThreads;
        const int r = idx / kRowChunks, c = (idx % kRowChunks) * 8;
        const bool ok = m0 + r < end && k0 + c < k;
        ra[i] = ok ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m0 + r) * k + k0 + c)
                   : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int i = 0; i < kChunksB; ++i) {
        const int idx = tid + i * kThreads;
        const int r = idx / kRowChunks, c = (idx % kRowChunks) * 8;
        const bool ok = n0 + r < n && k0 + c < k;
        rb[i] = ok ? __ldg(reinterpret_cast<const uint4*>(we + static_cast<int64_t>(n0 + r) * k + k0 + c))
                   : make_uint4(0u, 0u, 0u, 0u);
      }
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kRowsTile / 16];
#pragma unroll
    for (int mi = 0; mi < kRowsTile / 16; ++mi) wmma::fill_fragment(acc[mi], 0.0f);
    load(0);
    for (int k0 = 0; k0 < k; k0 += kKStep) {
#pragma unroll
      for (int i = 0; i < kChunksA; ++i) {
        const int idx = tid + i * kThreads;
        *reinterpret_cast<uint4*>(a_tile + (idx / kRowChunks) * kLd + (idx % kRowChunks) * 8) = ra[i];
      }
#pragma unroll
      for (int i = 0; i < kChunksB; ++i) {
        const int idx = tid + i * kThreads;
        *reinterpret_cast<uint4*>(b_tile + (idx / kRowChunks) * kLd + (idx % kRowChunks) * 8) = rb[i];
      }
      __syncthreads();
      if (k0 + kKStep < k) load(k0 + kKStep);  // in flight during the MMAs below
#pragma unroll
      for (int kk = 0; kk < kKStep; kk += 16) {
        // B (k x n) column-major = the weight rows [n][k] as stored.
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(b, b_tile + (warp * 16) * kLd + kk, kLd);
#pragma unroll
        for (int mi = 0; mi < kRowsTile / 16; ++mi) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
          wmma::load_matrix_sync(a, a_tile + (mi * 16) * kLd + kk, kLd);
          wmma::mma_sync(acc[mi], a, b, acc[mi]);
        }
      }
      __syncthreads();  // every warp is done with the tiles before they are overwritten
    }
#pragma unroll
    for (int mi = 0; mi < kRowsTile / 16; ++mi)
      wmma::store_matrix_sync(c_tile + (mi * 16) * (kColsTile + 4) + warp * 16, acc[mi], kColsTile + 4,
                              wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < kRowsTile * kColsTile / 2; idx += kThreads) {
      const int r = idx / (kColsTile / 2), c = (idx % (kColsTile / 2)) * 2;
      if (m0 + r >= end || n0 + c >= n) continue;
      const float* v = c_tile + r * (kColsTile + 4) + c;
      *reinterpret_cast<__nv_bfloat162*>(y + static_cast<int64_t>(m0 + r) * n + n0 + c) = __floats2bfloat162_rn(v[0], v[1]);
    }
    __syncthreads();  // c_tile is read before the next chunk stores into it
  }
}

}  // namespace

bool moe_grouped_gemm_supported(int32_t n, int32_t k) { return n > 0 && k > 0 && n % 2 == 0 && k % 8 == 0; }

cudaError_t moe_grouped_gemm(const int32_t* offsets, int32_t num_experts, const bf16* x, const bf16* w, int32_t n,
                             int32_t k, bf16* y, cudaStream_t stream) {
  if (!moe_grouped_gemm_supported(n, k) || num_experts <= 0 || num_experts > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((n + kColsTile - 1) / kColsTile), static_cast<unsigned>(num_experts));
  moe_grouped_gemm_kernel<<<grid, kThreads, 0, stream>>>(offsets, reinterpret_cast<const __nv_bfloat16*>(x),
                                                         reinterpret_cast<const __nv_bfloat16*>(w), n, k,
                                                         reinterpret_cast<__nv_bfloat16*>(y));
  return cudaGetLastError();
}

}  // namespace pagoda::cuda
