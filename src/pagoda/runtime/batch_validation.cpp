#include "pagoda/runtime/batch_validation.h"

namespace pagoda::runtime {

Status validate_forward_batch(const ForwardBatch& batch, const KvPoolShape& pool, const BatchLimits& limits) {
  if (batch.positions.size() != batch.token_ids.size())
    return invalid_argument_error("forward batch: {} token ids but {} positions", batch.token_ids.size(),
                                  batch.positions.size());
  if (!batch.deferred_tokens.empty() && !limits.deferred_tokens)
    return invalid_argument_error("forward batch: {} deferred tokens outside an overlapped launch",
                                  batch.deferred_tokens.size());
  if (batch.num_tokens() > limits.max_num_tokens)
    return invalid_argument_error("forward batch: {} tokens, over max_num_tokens {}", batch.num_tokens(),
                                  limits.max_num_tokens);
  if (static_cast<int64_t>(batch.sequences.size()) > limits.max_num_seqs)
    return invalid_argument_error("forward batch: {} sequences, over max_num_seqs {}", batch.sequences.size(),
                                  limits.max_num_seqs);
  for (size_t t = 0; t < batch.token_ids.size(); ++t) {
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= limits.vocab_size)
      return invalid_argument_error("forward batch: token id {} at row {} is outside the vocabulary [0, {})",
                                    batch.token_ids[t], t, limits.vocab_size);
    if (batch.positions[t] < 0)
      return invalid_argument_error("forward batch: negative position {} at row {}", batch.positions[t], t);
  }
  int32_t expected_offset = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    if (seq.token_offset != expected_offset || seq.num_new_tokens < 1 || seq.num_cached_tokens < 0)
      return invalid_argument_error(
          "forward batch: sequence {} has token_offset {} (expected {}), num_new_tokens {} (>= 1), "
          "num_cached_tokens {} (>= 0)", s, seq.token_offset, expected_offset, seq.num_new_tokens,
          seq.num_cached_tokens);
    expected_offset += seq.num_new_tokens;
    const int64_t total = static_cast<int64_t>(seq.num_cached_tokens) + seq.num_new_tokens;
    if (total > limits.max_sequence_tokens)
      return invalid_argument_error("forward batch: sequence {} holds {} tokens, over the longest sequence {}", s,
                                    total, limits.max_sequence_tokens);
    const int64_t blocks_needed = (total + pool.block_size - 1) / pool.block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed)
      return invalid_argument_error("forward batch: sequence {} holds {} tokens and needs {} blocks of {}, but its "
                                    "block table has {}", s, total, blocks_needed, pool.block_size,
                                    seq.block_table.size());
    for (int64_t j = 0; j < blocks_needed; ++j) {
      const int32_t block = seq.block_table[static_cast<size_t>(j)];
      if (block < 0 || block >= pool.num_blocks)
        return invalid_argument_error("forward batch: sequence {} block table entry {} = {} is outside the pool "
                                      "[0, {})", s, j, block, pool.num_blocks);
    }
  }
  if (expected_offset != batch.num_tokens())
    return invalid_argument_error("forward batch: sequences cover {} tokens but the batch has {}", expected_offset,
                                  batch.num_tokens());
  return ok_status();
}

Status check_pool_matches(const KvPoolShape& pool, const KvPoolShape& expected) {
  if (pool.num_layers != expected.num_layers || pool.num_kv_heads != expected.num_kv_heads ||
      pool.head_dim != expected.head_dim || pool.block_size != expected.block_size ||
      pool.key_dtype != expected.key_dtype || pool.value_dtype != expected.value_dtype ||
      pool.latent != expected.latent || pool.latent_rope_dim != expected.latent_rope_dim ||
      pool.cross_layer_share != expected.cross_layer_share || pool.latent_pages != expected.latent_pages)
    return invalid_argument_error(
        "KV pool ({}layers={} (cross-layer share {}) kv_heads={} head_dim={} block_size={} kv dtypes={}/{}) does not fit the model "
        "({}layers={} (cross-layer share {}) kv_heads={} head_dim={} block_size={} kv dtypes={}/{})",
        pool.latent ? fmt::format("MLA latent ({} pages), ", runtime::mla_latent_pages_name(pool.latent_pages)) : "", pool.num_layers, pool.cross_layer_share, pool.num_kv_heads, pool.head_dim, pool.block_size, dtype_name(pool.key_dtype),
        dtype_name(pool.value_dtype),
        expected.latent ? fmt::format("MLA latent ({} pages), ", runtime::mla_latent_pages_name(expected.latent_pages))
                        : "", expected.num_layers,
        expected.cross_layer_share, expected.num_kv_heads, expected.head_dim, expected.block_size, dtype_name(expected.key_dtype),
        dtype_name(expected.value_dtype));
  return ok_status();
}

}  // namespace pagoda::runtime
