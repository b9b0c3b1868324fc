#include "pagoda/cli/kv_tier_flags.h"

#include <fmt/format.h>

#include "pagoda/core/dtype.h"
#include "pagoda/kvstore/disk_tier.h"
#include "pagoda/kvstore/model_fingerprint.h"
#include "pagoda/kvstore/redis_tier.h"
#include "pagoda/runtime/host_block_layout.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::cli {

void add_kv_tier_flags(CLI::App& cmd, KvTierFlags& flags) {
  cmd.add_option("--kv-offload-disk", flags.disk_dir,
                 "Directory for a KV tier on local disk below the host tier (needs --kv-offload-memory): blocks the "
                 "host tier receives are written there by a background thread and read back on a hit; it outlives "
                 "the process (a restarted server hits what the last one wrote). One server per directory (a lock "
                 "file)");
  cmd.add_option("--kv-offload-disk-size", flags.disk_size,
                 "Bytes the disk tier may hold, e.g. 100GiB; least recently used blocks are deleted past it")
      ->capture_default_str();
  cmd.add_option("--kv-offload-redis", flags.redis_url,
                 "redis://HOST:PORT[/DB]: a KV tier in redis below the disk tier (needs --kv-offload-memory), shared "
                 "by every pagoda pointed at it. Unreachable at start: a warning and no redis tier");
  cmd.add_option("--kv-offload-redis-ttl", flags.redis_ttl_seconds,
                 "Seconds a block stays in redis after it is written (0: no expiry)")
      ->capture_default_str();
  cmd.add_flag("--kv-offload-redis-required", flags.redis_required,
               "Refuse to start when --kv-offload-redis cannot be reached");
}

std::string kv_tier_settings(const backend::RunnerSpec& spec, int32_t block_size, size_t block_bytes,
                             const KvPoolShape& geometry) {
  std::string settings =
      fmt::format("device={} k={} v={} block_size={} block_bytes={} weight_seed={}", backend::device_name(spec.device),
                  dtype_name(spec.key_dtype), dtype_name(spec.value_dtype), block_size, block_bytes,
                  spec.model_dir.empty() ? spec.weight_seed : 0);
  // A tensor-parallel host block is the ranks' blocks in rank order: another byte layout than TP=1's.
  if (spec.tensor_parallel_size > 1) settings += fmt::format(" tensor_parallel_size={}", spec.tensor_parallel_size);
  // Swizzled latent pages hold the same bytes per block as token-major ones, laid out otherwise.
  if (geometry.latent && geometry.latent_pages != runtime::MlaLatentPages::kTokenMajor)
    settings += fmt::format(" mla_pages={}", runtime::mla_latent_pages_name(geometry.latent_pages));
  return settings;
}

StatusOr<std::unique_ptr<kvstore::LowerTiers>> open_kv_tiers(const KvTierFlags& flags,
                                                             const backend::RunnerSetup& setup,
                                                             kv::KvCacheConfig& kv_config,
                                                             const std::function<void(const std::string&)>& warn) {
  const bool want_disk = !flags.disk_dir.empty();
  const bool want_redis = !flags.redis_url.empty();
  if (!want_disk && !want_redis) return std::unique_ptr<kvstore::LowerTiers>();
  const char* which = want_disk ? "--kv-offload-disk" : "--kv-offload-redis";
  if (setup.num_host_blocks == 0)
    return invalid_argument_error("{} needs a host tier: give --kv-offload-memory (e.g. 1GiB); blocks reach the "
                                  "tiers below through it", which);
  if (!setup.runner->capabilities().host_block_access)
    return unimplemented_error("{}: this device's model runner cannot read its host blocks", which);
  const size_t block_bytes = runtime::host_block_layout(setup.runner->kv_geometry()).block_bytes();
  const backend::RunnerSpec& spec = setup.spec;
  const std::string settings = kv_tier_settings(spec, setup.block_size, block_bytes, setup.runner->kv_geometry());
  PAGODA_ASSIGN_OR_RETURN(const std::string fingerprint,
                          kvstore::model_fingerprint(spec.model_dir, spec.config_path, settings));

  std::unique_ptr<kvstore::BlockStore> disk, redis;
  if (want_disk) {
    auto size = parse_byte_size(flags.disk_size);
    if (!size.ok() || *size <= 0)
      return invalid_argument_error("--kv-offload-disk-size {}: expected a positive size such as 100GiB", flags.disk_size);
    PAGODA_ASSIGN_OR_RETURN(disk, kvstore::DiskTier::open({.dir = flags.disk_dir, .capacity_bytes = *size,
                                                           .block_bytes = block_bytes}));
  } else if (flags.disk_size != "0") {
    return invalid_argument_error("--kv-offload-disk-size {} without --kv-offload-disk DIR", flags.disk_size);
  }
  if (want_redis) {
    PAGODA_ASSIGN_OR_RETURN(const kvstore::RedisEndpoint endpoint, kvstore::parse_redis_url(flags.redis_url));
    auto opened = kvstore::RedisTier::open(
        {.endpoint = endpoint, .ttl_seconds = flags.redis_ttl_seconds, .block_bytes = block_bytes});
    if (opened.ok()) {
      redis = std::move(*opened);
    } else if (flags.redis_required || opened.status().code() == StatusCode::kInvalidArgument) {
      return opened.status();
    } else {
      warn(fmt::format("--kv-offload-redis {}: unreachable ({}); running without the redis tier", flags.redis_url,
                       opened.status().to_string()));
    }
  }
  if (!disk && !redis) return std::unique_ptr<kvstore::LowerTiers>();
  kv_config.stable_key_fingerprint = fingerprint;
  kv_config.host_write_through = true;
  return std::make_unique<kvstore::LowerTiers>(block_bytes, std::move(disk), std::move(redis));
}

}  // namespace pagoda::cli
