#pragma once
// Turns CUDA runtime and cuBLAS(Lt) return codes into Status, naming the call's
// file and line, so every CUDA call is checked without exceptions.
//
//   PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));
//   PAGODA_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(...));

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "pagoda/core/status.h"

namespace pagoda::cuda {

// ok when err == cudaSuccess; otherwise an internal error such as
// "CUDA error 2 (out of memory) at cuda_model.cpp:120: cudaMalloc(...)".
Status cuda_status(cudaError_t err, const char* expr, const char* file, int line);
Status cublas_status(cublasStatus_t err, const char* expr, const char* file, int line);

}  // namespace pagoda::cuda

#define PAGODA_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                     \
    const cudaError_t pagoda_cuda_err_ = (expr);                                           \
    if (pagoda_cuda_err_ != cudaSuccess)                                                   \
      return ::pagoda::cuda::cuda_status(pagoda_cuda_err_, #expr, __FILE__, __LINE__);     \
  } while (0)

#define PAGODA_CUBLAS_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                     \
    const cublasStatus_t pagoda_cublas_err_ = (expr);                                      \
    if (pagoda_cublas_err_ != CUBLAS_STATUS_SUCCESS)                                       \
      return ::pagoda::cuda::cublas_status(pagoda_cublas_err_, #expr, __FILE__, __LINE__); \
  } while (0)
