#include "pagoda/backend/startup_report.h"

#include <algorithm>

#include <fmt/format.h>

#include "pagoda/model/kv_geometry.h"
#include "pagoda/runtime/cross_layer_share.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::backend {

std::string_view device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

int64_t blocks_for_tokens(int64_t tokens, int32_t block_size) { return (tokens + block_size - 1) / block_size; }

StatusOr<int32_t> host_tier_blocks(const RunnerSpec& spec, int64_t kv_bytes_per_token) {
  if (spec.kv_offload_memory <= 0) return 0;
  const int64_t block_bytes = kv_bytes_per_token * spec.block_size;
  const int64_t blocks = block_bytes > 0 ? spec.kv_offload_memory / block_bytes : 0;
  if (blocks < 1)
    return invalid_argument_error("--kv-offload-memory {}: holds no KV block of {} tokens ({} per block)",
                                  format_bytes(static_cast<double>(spec.kv_offload_memory)), spec.block_size,
                                  format_bytes(static_cast<double>(block_bytes)));
  if (blocks > INT32_MAX / 2)
    return invalid_argument_error("--kv-offload-memory {}: {} blocks is more than a pool can index",
                                  format_bytes(static_cast<double>(spec.kv_offload_memory)), blocks);
  return static_cast<int32_t>(blocks);
}

std::string kv_tiers_line(const RunnerSetup& setup, bool pinned) {
  const auto bytes = [&](int64_t blocks) {
    return format_bytes(static_cast<double>(blocks * setup.block_size * setup.kv_bytes_per_token));
  };
  if (setup.num_host_blocks == 0)
    return fmt::format("KV tiers: device {} blocks ({}); no host tier (--kv-offload-memory 0)",
                       format_with_commas(setup.num_blocks), bytes(setup.num_blocks));
  return fmt::format("KV tiers: device {} blocks ({}), host {} blocks ({}{}) = {} tokens; evicted blocks are "
                     "written back to the host tier", format_with_commas(setup.num_blocks), bytes(setup.num_blocks),
                     format_with_commas(setup.num_host_blocks), bytes(setup.num_host_blocks),
                     pinned ? ", pinned" : "",
                     format_with_commas((static_cast<int64_t>(setup.num_blocks) + setup.num_host_blocks) *
                                        setup.block_size));
}

int64_t RunnerSetup::max_concurrent_full_requests() const {
  if (max_model_len <= 0 || block_size <= 0) return 0;
  return num_blocks / blocks_for_tokens(max_model_len, block_size);
}

KvPoolShape pool_shape(const ModelConfig& config, const RunnerSpec& spec, int32_t num_blocks) {
  KvPoolShape shape = model_kv_pool_shape(config, num_blocks, spec.block_size, spec.key_dtype, spec.value_dtype);
  shape.cross_layer_share = spec.kv_cross_layer_share;
  return shape;
}

Status check_cross_layer_share(const ModelConfig& config, const RunnerSpec& spec) {
  if (spec.kv_cross_layer_share == 1) return ok_status();
  PAGODA_RETURN_IF_ERROR(
      runtime::validate_cross_layer_share(spec.kv_cross_layer_share, config.num_layers, "--kv-cross-layer-share"));
  if (config.mla)
    return invalid_argument_error("--kv-cross-layer-share {}: not for an MLA model (it caches one latent per layer)",
                                  spec.kv_cross_layer_share);
  if (spec.device == Device::kCuda) {
    // The CUDA merge (backend/cuda/kv_share_ops.h) writes bf16 or fp8 directions only.
    for (DType dtype : {spec.key_dtype, spec.value_dtype}) {
      if (dtype != DType::kBF16 && dtype != DType::kFP8E4M3)
        return unimplemented_error("--kv-cross-layer-share {}: on --device cuda with a bf16 or fp8 KV cache only, "
                                   "not {} ({})", spec.kv_cross_layer_share, dtype_name(dtype),
                                   kv_dtype_flags_text(spec));
    }
  } else if (spec.device != Device::kCpu) {
    return unimplemented_error("--kv-cross-layer-share {}: not on --device {} yet (cpu, cuda)",
                               spec.kv_cross_layer_share, device_name(spec.device));
  }
  if (spec.tensor_parallel_size > 1)
    return unimplemented_error("--kv-cross-layer-share {} cannot be combined with --tensor-parallel-size {} yet",
                               spec.kv_cross_layer_share, spec.tensor_parallel_size);
  if (spec.kv_offload_memory > 0)
    return invalid_argument_error("--kv-cross-layer-share {} cannot be combined with --kv-offload-memory: a shared "
                                  "block's norm records have no host form yet", spec.kv_cross_layer_share);
  return ok_status();
}

std::string kv_dtype_flags_text(const RunnerSpec& spec) {
  if (spec.key_dtype == spec.value_dtype) return fmt::format("--kv-cache-dtype {}", dtype_name(spec.key_dtype));
  return fmt::format("--kv-cache-dtype-k {} --kv-cache-dtype-v {}", dtype_name(spec.key_dtype),
                     dtype_name(spec.value_dtype));
}

Status with_kv_dtype_context(const Status& status, const RunnerSpec& spec) {
  return status.with_context(fmt::format("{} on --device {}", kv_dtype_flags_text(spec), device_name(spec.device)));
}

std::string model_summary(const ModelConfig& c, const RunnerSpec& spec) {
  const std::string source = spec.load_format == LoadFormat::kRandom
                                 ? fmt::format("random weights for {} (seed {})", spec.config_path, spec.weight_seed)
                                 : spec.model_dir;
  if (c.mla) {
    const MlaConfig& m = *c.mla;
    std::string experts;
    if (c.moe)
      experts = fmt::format("; MoE from layer {}: {} routed experts (top {}) + {} shared, {} each",
                            c.moe->first_k_dense_replace, c.moe->num_experts, c.moe->experts_per_token,
                            c.moe->num_shared_experts, c.moe->moe_intermediate_size);
    return fmt::format("model: {} from {}: {} layers, hidden {}, {} heads, attention MLA (latent {} + rope {}, "
                       "q {}, qk {} + {}, v {}){}, vocab {}", c.architecture_name, source, c.num_layers,
                       c.hidden_size, c.num_q_heads, m.kv_lora_rank, m.qk_rope_head_dim,
                       m.q_lora_rank > 0 ? fmt::format("LoRA {}", m.q_lora_rank) : std::string("plain"),
                       m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, experts, c.vocab_size);
  }
  return fmt::format("model: {} from {}: {} layers, hidden {}, heads {}/{} (head_dim {}), vocab {}",
                     c.architecture_name, source, c.num_layers, c.hidden_size, c.num_q_heads, c.num_kv_heads,
                     c.head_dim, c.vocab_size);
}

void add_kv_report(const RunnerSetup& setup, std::vector<std::string>& lines) {
  const RunnerSpec& f = setup.spec;
  KvShape shape = model_kv_shape(setup.config);
  shape.cross_layer_share = f.kv_cross_layer_share;
  lines.push_back(format_kv_cache_line(shape, f.key_dtype, f.value_dtype,
                                       setup.kv_pool_tokens() * setup.kv_bytes_per_token, setup.block_size) +
                  " (scales included)");
  if (shape.is_mla()) {  // one layer's cached vector (fp8: runtime/mla_fp8_layout.h's record) beside MHA's K/V
    const KvShape mha = mha_equivalent(shape);
    lines.push_back(fmt::format("KV cache per layer: MLA {} {} B/token (MHA K/V in bf16: {} B/token)",
                                dtype_name(f.key_dtype),
                                format_with_commas(mla_vector_bytes(shape.mla_latent_dim, shape.mla_rope_dim,
                                                                    f.key_dtype)),
                                format_with_commas(kv_bytes_per_token(mha, DType::kBF16) / std::max<int64_t>(
                                                                                                 mha.layers, 1))));
  }
  lines.push_back(fmt::format(
      "capacity: {} tokens in the KV pool = {} requests of {} tokens (max_model_len) at once; max-num-seqs {}, "
      "max-tokens-per-step {}", setup.kv_pool_tokens(), setup.max_concurrent_full_requests(), setup.max_model_len,
      f.max_num_seqs, f.max_tokens_per_step));
}

}  // namespace pagoda::backend
