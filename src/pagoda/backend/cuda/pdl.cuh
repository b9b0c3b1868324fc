#pragma once
// Programmatic dependent launch (PDL, sm_90+) for the decode step's kernels.
//
// A kernel launched through launch_pdl() may start while the kernel before it in the stream is still
// running: as soon as every block of that kernel has executed pdl_launch_dependents() (or exited). Before it
// reads anything the earlier kernels wrote, or writes anything they may still read, it must execute
// pdl_wait(), which returns once every earlier grid has completed and its memory is visible. Work that
// depends on no earlier kernel (a GEMV's weight loads) goes before the wait and overlaps the kernel ahead.
// Every kernel launched through launch_pdl() must call pdl_wait() in every block before it exits (that keeps
// completion transitive: a later kernel's wait covers all kernels before it). Kernels launched plainly
// wait for everything before them as always; pdl_launch_dependents() in any kernel only lets the next
// kernel's blocks start early and is a no-op when that kernel was launched plainly. Both are no-ops on
// launches without the attribute and below sm_90. Inside stream capture the attribute becomes a
// programmatic edge of the CUDA graph.
//
// The order inside a kernel: pdl_wait() first, pdl_launch_dependents() after it. Then a kernel lets its
// successor in only once its own predecessor has completed, so at most one early kernel overlaps a running
// one. Triggering before the wait chained the early launches (GEMV -> norm -> next GEMV): the next
// projection's blocks took SM slots and bandwidth while the current one still streamed, and batch-1 bf16
// decode was 0.2 ms a step slower with PDL than without; in this order PDL gains on both weight types
// (docs/BENCHMARKS.md, "PDL: wait before trigger").
//
// pdl_enabled(): on unless the environment sets PAGODA_PDL=0 (read at the first launch) or
// set_pdl_enabled(false) was called; when off, launch_pdl launches plainly and the griddepcontrol
// instructions are no-ops. set_pdl_enabled is for tests and benchmarks; it affects launches made after it
// (a graph keeps what it was captured with).
// Thread safety: pdl_enabled / set_pdl_enabled are atomic; launch_pdl is a plain launch on the caller's stream.

#include <utility>

#include <cuda_runtime.h>

namespace pagoda::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

bool pdl_enabled();
void set_pdl_enabled(bool enabled);

template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(std::forward<Args>(args))...);
}

}  // namespace pagoda::cuda
