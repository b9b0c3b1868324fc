#include "pagoda/parallel/communicator.h"

namespace pagoda::parallel {

Status check_reduce_dtype(DType dtype, const char* collective) {
  if (dtype == DType::kF32 || dtype == DType::kBF16) return ok_status();
  return invalid_argument_error("{}: dtype {} not supported (f32 or bf16)", collective, dtype_name(dtype));
}

Status check_copy_dtype(DType dtype, const char* collective) {
  if (dtype_bits(dtype) % 8 == 0) return ok_status();
  return invalid_argument_error("{}: dtype {} is not whole bytes per element", collective, dtype_name(dtype));
}

size_t element_bytes(DType dtype) { return static_cast<size_t>(dtype_bits(dtype) / 8); }

}  // namespace pagoda::parallel
