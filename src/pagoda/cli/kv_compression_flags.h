#pragma once
// The token-eviction flags that `pagoda generate`, `serve` and `eval` share
// (runtime/kv_compression.h, docs/KV_CACHE.md "Token eviction"):
//
//   --kv-compression none|streaming|h2o|snapkv|pyramidkv|entropy
//   --kv-budget TOKENS       KV tokens kept per layer and KV head (mean for pyramidkv / entropy)
//   --kv-sink-tokens N       first tokens always kept (default 4)
//   --kv-window N            most recent tokens always kept, and the observation window (default 32)
//   --kv-span N              scored policies: tokens after an attended one kept with it (default 16; 0: off)
//
// Errors name the flag: an unknown policy, a budget not above sinks + window,
// a budget without a policy, or a policy with --kv-cross-layer-share > 1 (not combined yet).
// Every policy runs on both devices; what a model cannot run (MLA, a sliding window, tensor
// parallelism) the engine or the runner setup refuses by name.
//
// Thread safety: plain functions; call from one thread at start-up.

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda::cli {

struct KvCompressionFlags {
  std::string policy = "none";
  int32_t budget = 0;
  int32_t sink_tokens = 4;
  int32_t window = 32;
  int32_t span = 16;
};

void add_kv_compression_flags(CLI::App& cmd, KvCompressionFlags& flags);
StatusOr<runtime::KvCompressionConfig> resolve_kv_compression_flags(const KvCompressionFlags& flags,
                                                                    backend::Device device,
                                                                    int32_t cross_layer_share = 1);

}  // namespace pagoda::cli
