#include "pagoda/backend/cuda/cuda_check.h"

#include <filesystem>

namespace pagoda::cuda {

namespace {
std::string base_name(const char* file) { return std::filesystem::path(file).filename().string(); }
}  // namespace

Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return ok_status();
  const StatusCode code =
      err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, fmt::format("CUDA error {} ({}) at {}:{}: {}", static_cast<int>(err),
                                  cudaGetErrorString(err), base_name(file), line, expr));
}

Status cublas_status(cublasStatus_t err, const char* expr, const char* file, int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error("cuBLAS error {} at {}:{}: {}", static_cast<int>(err), base_name(file), line, expr);
}

}  // namespace pagoda::cuda
