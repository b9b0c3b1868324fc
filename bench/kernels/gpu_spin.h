#pragma once
// spin_gpu: one 32-thread CTA that waits `microseconds` on the GPU's global
// timer and reads or writes no memory, so the L2 keeps what the previous
// launch left there (unlike a memset, whose dirty lines are written back while
// the next kernel runs). Thread safety: a plain launch on `stream`.
#include <cuda_runtime.h>

cudaError_t spin_gpu(double microseconds, cudaStream_t stream);
