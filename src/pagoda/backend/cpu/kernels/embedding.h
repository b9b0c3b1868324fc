#pragma once
// Token embedding lookup: out[t, :] = f32(table[token_ids[t], :]).
// table: a [vocab, hidden] WeightMatrix in f32/f16/bf16; out: [num_tokens, hidden] f32.
// Token ids must already be validated against table.rows (asserted only).

#include <cstddef>
#include <cstdint>

#include "pagoda/backend/cpu/kernels/matmul.h"

namespace pagoda::kernels {

void embedding_lookup(const WeightMatrix& table, const int32_t* token_ids, size_t num_tokens,
                      float* out);

}  // namespace pagoda::kernels
