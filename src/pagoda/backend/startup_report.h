#pragma once
// Pieces of the start-up report and of the errors every backend shares: the KV
// pool shape a spec asks for, the flags that chose the KV dtypes, the model
// line and the KV / capacity lines (kv_sizing's start-up line, as kvcalc
// prints it).
//
// Thread safety: plain functions.

#include <string>
#include <vector>

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"
#include "pagoda/model/model_config.h"
#include "pagoda/runtime/kv_pool_shape.h"

namespace pagoda::backend {

KvPoolShape pool_shape(const ModelConfig& config, const RunnerSpec& spec, int32_t num_blocks);
// --kv-cross-layer-share against the model and the other settings: K in [1, layers / 2], no MLA,
// cpu only, no host tier. Errors name the flag.
Status check_cross_layer_share(const ModelConfig& config, const RunnerSpec& spec);
// "--kv-cache-dtype int8" or "--kv-cache-dtype-k int8 --kv-cache-dtype-v int4".
std::string kv_dtype_flags_text(const RunnerSpec& spec);
// A backend error caused by the chosen KV dtypes keeps its code and gains the flags.
Status with_kv_dtype_context(const Status& status, const RunnerSpec& spec);
std::string model_summary(const ModelConfig& config, const RunnerSpec& spec);
// The KV line and the capacity line; both end the report.
void add_kv_report(const RunnerSetup& setup, std::vector<std::string>& lines);
int64_t blocks_for_tokens(int64_t tokens, int32_t block_size);
// Host-tier blocks that --kv-offload-memory holds (0 when it is 0); kInvalidArgument
// naming the flag when it holds no block or more than a pool can index.
StatusOr<int32_t> host_tier_blocks(const RunnerSpec& spec, int64_t kv_bytes_per_token);
// "KV tiers: device 1,000 blocks (1.95 GiB), host 3,000 blocks (5.86 GiB, pinned) = 64,000 tokens"
std::string kv_tiers_line(const RunnerSetup& setup, bool pinned);

}  // namespace pagoda::backend
