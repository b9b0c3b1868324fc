#pragma once
// Small sm_80+/sm_90 building blocks shared by the attention kernels: async
// 16-byte copies into shared memory, ldmatrix, the bf16 and e4m3 tensor-core MMAs,
// streaming 16-byte loads and bf16 <-> f32 conversions. Device code only; include from .cu files.

#include <cuda_bf16.h>
#include <cstdint>

namespace pagoda::kernels::cuda::device {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1. When !valid, the 16 bytes are zero-filled
// and nothing is read (src must still be a mapped address).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
}
// 16 bytes global -> shared, bypassing L1, of which the first src_bytes (0..16)
// are read and the rest zero-filled.
__device__ __forceinline__ void cp_async_16_prefix(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
}
// cp.async of 4, 8 or 16 bytes through L1 (scale records); zero-fills when !valid.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "n"(kBytes), "r"(valid ? kBytes : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}
// The store counterpart (sm_90): matrix m's fragment in r[m] (the mma accumulator layout: lane l holds
// row l / 4, columns 2 (l % 4) and + 1, low half first), each matrix stored transposed: lanes 8m..8m+7 give
// the addresses of its rows after the transpose (its columns before), 16 bytes each.
__device__ __forceinline__ void stmatrix_x4_trans(const uint32_t (&r)[4], void* smem_row) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(smem_row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// d += a * b for one m16n8k16 tile: a row-major bf16 (4 regs), b "col" bf16 (2 regs), d f32.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b for one m16n8k32 tile of e4m3 (sm_89+): a row-major (4 regs of 4 bytes), b "col" (2 regs), d f32.
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A 16-byte global load read once (the weight streams of the GEMVs): the non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 load_global_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Programmatic dependent launch (sm_90): launch_dependents lets the grid
// launched after this one with the programmatic-serialization attribute start
// its CTAs now; wait_for_prior_grids blocks until every earlier grid has
// completed and its writes are visible. Both are no-ops for plain launches.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Two floats -> one register of two bf16 (lo in the low half), round to nearest.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Eight bf16 in a uint4 -> eight floats (exact: bf16 is the top half of an f32).
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

}  // namespace pagoda::kernels::cuda::device
