#pragma once
// `pagoda serve`'s flags for the KV tiers below the host tier (disk, redis)
// and their opening into kvstore::LowerTiers.
//
//   --kv-offload-disk DIR --kv-offload-disk-size BYTES
//   --kv-offload-redis redis://HOST:PORT[/DB] [--kv-offload-redis-ttl SECONDS] [--kv-offload-redis-required]
//
// Both need the host tier (--kv-offload-memory): blocks reach them from it and
// come back through it. An unwritable DIR, or one another server holds, is a
// start-up error naming it; an unreachable redis is a warning and no redis
// tier, or an error with --kv-offload-redis-required.
//
// Thread safety: plain functions; call from one thread at start-up.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "pagoda/backend/runner_setup.h"
#include "pagoda/core/status.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/kvstore/lower_tiers.h"

namespace pagoda::cli {

struct KvTierFlags {
  std::string disk_dir;
  std::string disk_size = "0";
  std::string redis_url;
  int64_t redis_ttl_seconds = 0;
  bool redis_required = false;
};

void add_kv_tier_flags(CLI::App& cmd, KvTierFlags& flags);

// The KV settings the tiers' model fingerprint covers (kvstore::model_fingerprint): every setting that
// changes what a host block's bytes mean (device, K/V dtypes, block size and bytes, random weights' seed,
// the tensor-parallel size, an MLA latent pool's block layout), so a block stored under other settings
// is never a hit. Settings of the pools before a setting was added give the same string as before.
std::string kv_tier_settings(const backend::RunnerSpec& spec, int32_t block_size, size_t block_bytes,
                             const KvPoolShape& geometry);

// Opens the tiers the flags ask for (null when none) and sets what the KV
// manager needs for them in `kv_config` (stable keys under the model
// fingerprint, host write-through). `warn` gets the unreachable-redis warning.
StatusOr<std::unique_ptr<kvstore::LowerTiers>> open_kv_tiers(const KvTierFlags& flags,
                                                             const backend::RunnerSetup& setup,
                                                             kv::KvCacheConfig& kv_config,
                                                             const std::function<void(const std::string&)>& warn);

}  // namespace pagoda::cli
