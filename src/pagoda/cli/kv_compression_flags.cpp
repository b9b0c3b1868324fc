#include "pagoda/cli/kv_compression_flags.h"

namespace pagoda::cli {

void add_kv_compression_flags(CLI::App& cmd, KvCompressionFlags& flags) {
  cmd.add_option("--kv-compression", flags.policy,
                 "token eviction: none, streaming, h2o, snapkv, pyramidkv or entropy (docs/KV_CACHE.md)")
      ->capture_default_str();
  cmd.add_option("--kv-budget", flags.budget,
                 "KV tokens kept per sequence, layer and KV head under --kv-compression (mean over heads for "
                 "pyramidkv and entropy)");
  cmd.add_option("--kv-sink-tokens", flags.sink_tokens, "first tokens token eviction always keeps")
      ->capture_default_str();
  cmd.add_option("--kv-window", flags.window,
                 "most recent tokens token eviction always keeps; also the observation window of the scores")
      ->capture_default_str();
  cmd.add_option("--kv-span", flags.span,
                 "snapkv / pyramidkv / entropy: the tokens after an attended one kept with it, its score decaying "
                 "0.97x a token, so a passage the observation window points at is kept whole; it needs room (measured "
                 "helping from ~192-token budgets over 1K contexts): 0-2 for tight budgets, 0 = SnapKV's plain "
                 "pooling (docs/KV_CACHE.md)")
      ->capture_default_str();
}

StatusOr<runtime::KvCompressionConfig> resolve_kv_compression_flags(const KvCompressionFlags& flags,
                                                                    backend::Device /*device*/,
                                                                    int32_t cross_layer_share) {
  runtime::KvCompressionConfig c;
  PAGODA_ASSIGN_OR_RETURN(c.policy, runtime::parse_kv_compression_policy(flags.policy, "--kv-compression"));
  c.budget = flags.budget;
  c.sink_tokens = flags.sink_tokens;
  c.window = flags.window;
  c.span = flags.span;
  PAGODA_RETURN_IF_ERROR(runtime::validate_kv_compression(c, "--kv-"));
  if (c.enabled() && cross_layer_share > 1)
    return invalid_argument_error("--kv-compression {} cannot be combined with --kv-cross-layer-share {} (a compaction "
                                  "would have to choose one kept set per shared group): give one", flags.policy,
                                  cross_layer_share);
  return c;
}

}  // namespace pagoda::cli
