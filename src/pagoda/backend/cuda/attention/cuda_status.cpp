#include "pagoda/backend/cuda/attention/cuda_status.h"

namespace pagoda::kernels::cuda {

Status cuda_status(cudaError_t error, const char* what, const char* file, int line) {
  if (error == cudaSuccess) return ok_status();
  return internal_error("{} at {}:{}: {}: {}", what, file, line, cudaGetErrorName(error),
                        cudaGetErrorString(error));
}

}  // namespace pagoda::kernels::cuda
