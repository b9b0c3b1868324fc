#pragma once
// Stable block identity: a 256-bit key for a cached KV block that is the same
// in every process and on every machine that serves the same model with the
// same KV settings, so that tiers outliving the process (disk, redis) can be
// shared across restarts and replicas.
//
//   root(ns)     = SHA-256("pagoda-kv-key/1" | len fp | fp | len ns | ns)
//   key(block j) = SHA-256(key(block j - 1) or root(ns) | block_size | tokens as little-endian int32)
//
// fp is the model fingerprint (model config + the weights' safetensors header
// digest + KV dtypes + block size, made by the caller: kvstore/model_fingerprint.h).
// The tenant namespace is part of every key, so two tenants' identical
// prompts never share a key in any tier. The in-memory prefix cache keeps its
// fast 64-bit keys for lookup; these keys name blocks outside the process.
//
// Thread safety: pure functions.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "pagoda/kv/kv_types.h"

namespace pagoda::kv {

struct StableKey {
  std::array<uint8_t, 32> bytes{};
  bool operator==(const StableKey&) const = default;
  bool operator<(const StableKey& o) const { return bytes < o.bytes; }
};

struct StableKeyHash {
  size_t operator()(const StableKey& k) const {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(k.bytes[static_cast<size_t>(i)]) << (8 * i);
    return static_cast<size_t>(v);
  }
};

StableKey stable_namespace_root(std::string_view model_fingerprint, std::string_view tenant_namespace);
StableKey stable_block_key(const StableKey& previous, const TokenId* tokens, int32_t block_size);
// 64 lowercase hex digits (file and redis key names).
std::string stable_key_hex(const StableKey& key);

}  // namespace pagoda::kv
