#include "pagoda/backend/cpu/kernels/embedding.h"

#include <cassert>

namespace pagoda::kernels {

void embedding_lookup(const WeightMatrix& table, const int32_t* token_ids, size_t num_tokens,
                      float* out) {
  const size_t row_bytes = table.cols * static_cast<size_t>(dtype_bits(table.dtype) / 8);
  for (size_t t = 0; t < num_tokens; ++t) {
    assert(token_ids[t] >= 0 && static_cast<size_t>(token_ids[t]) < table.rows);
    const char* row = static_cast<const char*>(table.data) + token_ids[t] * row_bytes;
    convert_to_f32(table.dtype, row, out + t * table.cols, table.cols);
  }
}

}  // namespace pagoda::kernels
