#pragma once
// CUDA runtime errors as pagoda Status values, with the call, file and line.
//   PAGODA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));

#include <cuda_runtime.h>

#include "pagoda/core/status.h"

namespace pagoda::kernels::cuda {

// ok for cudaSuccess, else internal_error("<what> at <file>:<line>: <cuda error name>: <text>").
Status cuda_status(cudaError_t error, const char* what, const char* file, int line);

}  // namespace pagoda::kernels::cuda

#define PAGODA_CUDA_RETURN_IF_ERROR(call) \
  PAGODA_RETURN_IF_ERROR(::pagoda::kernels::cuda::cuda_status((call), #call, __FILE__, __LINE__))
