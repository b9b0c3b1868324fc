#pragma once
// Synchronization and copy building blocks of the warp-specialized prefill
// kernel (sm_90): shared-memory mbarriers (producer -> consumer "stage full" and
// consumer -> producer "stage empty" signals, bulk-copy transaction counts),
// tensor-map (TMA) loads, named barriers (a subset of a CTA's warps), and
// setmaxnreg (moving registers from the producer warpgroup to the consumers;
// sm_90a). Device code only; include from .cu files.

#include <cstdint>

#include "pagoda/backend/cuda/attention/device_primitives.cuh"

namespace pagoda::kernels::cuda::device {

// An mbarrier completes a phase when `count` arrivals have happened; waiters
// name the parity (0, 1, 0, ...) of the phase they wait for. Initialize from one
// thread, then __syncthreads before any other thread uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Run by the initializing thread after its inits, before the __syncthreads that
// publishes them: makes the inits visible to the async proxy too. Bulk copies
// complete their bytes on the barrier from the async proxy, which without this
// fence may still see the words as they were before the init (a previous CTA's
// barrier state on this SM). The CUDA programming guide's TMA example fences
// here; CUTLASS's pipelines do the fence.mbarrier_init.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile(
      "fence.mbarrier_init.release.cluster;\n"
      "fence.proxy.async.shared::cta;\n" ::
          : "memory");
}
// Arrive with release semantics: this thread's earlier writes (and, after a
// fence.proxy.async, its generic-proxy writes for async-proxy readers) are
// visible to a thread whose wait sees the phase complete.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(smem_address(bar))
      : "memory");
}
// Blocks until the phase with this parity has completed (acquire semantics).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Arrive (as above) and raise the phase's expected transaction bytes by `bytes`:
// the phase completes once the arrivals and that many bytes of bulk copies
// (tma_load_3d with this barrier) have landed.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// One box of a 3-D tensor map (coordinates innermost first, in elements) into
// shared memory through the copy engine, completing on `bar` (transaction
// bytes). The map lives in kernel parameter space (__grid_constant__).
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const void* tensor_map, int c0, int c1, int c2,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_address(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar))
      : "memory");
}

// The same for a 4-D tensor map.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(smem_address(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(bar))
      : "memory");
}

// Named barriers 1..15 (0 is __syncthreads): `threads` (a multiple of 32) take
// part; arrive does not wait, sync waits for all of them.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Per-thread register budget of the calling warpgroup from here on (sm_90a;
// a multiple of 8 in [24, 256]). Needs a register cap at kernel entry
// (__launch_bounds__(threads, 1)); all warps of the warpgroup execute it.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace pagoda::kernels::cuda::device
