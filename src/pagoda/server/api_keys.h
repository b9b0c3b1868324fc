#pragma once
// Api keys -> tenants. `--api-keys FILE` holds
//   {"keys": [{"key": "sk-...", "tenant": "name"}, ...]}
// and, optionally per entry, "admin": true and "limits": {"max_requests_in_flight": N, "tokens_per_minute":
// N, "max_kv_blocks": N, "min_priority": N} (each optional; 0 = none for the first three, tenant_quotas.h;
// min_priority, any integer, is the most urgent priority the tenant's requests may ask). Limits
// belong to the tenant: keys of one tenant may not set different ones. Files
// without "admin" or "limits" keep working.
// With keys loaded, every /v1 request needs `Authorization: Bearer <key>`; the
// tenant of the key becomes the request's KV cache namespace. The namespace
// never comes from the request body. Without keys every request is the tenant
// "default" (one shared namespace) and every caller counts as admin.
//
// An admin key (optional "admin": true) may also read what spans tenants: the
// server-wide /metrics, the KV events of every namespace and the load figures
// (a router polls with one). It still generates inside its own tenant's
// namespace. Without keys everyone is admin: there is only one tenant.
//
// Isolation inside a tenant (optional "user_salt" per entry): a key with
// "user_salt": true may send the header X-Pagoda-User: <id> with a request;
// the id is mixed into the namespace (cache_namespace(tenant, user)), so two
// users of one tenant never share KV blocks in any tier. "user_salt":
// "required" makes the header mandatory for that key. A key without the right
// that sends the header is refused (403), never silently salted or unsalted.
//
// Thread safety: immutable after load; lookups from any thread.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::server {

// A tenant's quotas (tenant_quotas.h, KvCacheManager::set_namespace_block_limit).
struct TenantLimits {
  int32_t max_requests_in_flight = 0;  // 0: no cap
  int64_t tokens_per_minute = 0;       // 0: no cap
  int32_t max_kv_blocks = 0;           // 0: no cap (enforced by the KV manager)
  // The most urgent "priority" its requests may ask (--scheduling-policy priority; lower is more urgent);
  // none: any. A request below it is refused (403 priority_not_allowed).
  std::optional<int32_t> min_priority;
  bool operator==(const TenantLimits&) const = default;
};

// Whether a key may salt its requests' namespace with a user id.
enum class UserSalt : uint8_t {
  kNotAllowed = 0,  // the X-Pagoda-User header is refused (403)
  kAllowed,         // optional: with it, the user's own namespace; without, the tenant's
  kRequired,        // every request of the key must name its user (400 without)
};

// Who a request's key says it is.
struct KeyIdentity {
  std::string tenant;
  bool admin = false;                  // may read what spans tenants (/metrics, KV events, load)
  std::optional<TenantLimits> limits;  // from the file; none: the server's defaults
  UserSalt user_salt = UserSalt::kNotAllowed;
};

// The request header carrying the end user's id for a salting key.
inline constexpr std::string_view kUserSaltHeader = "X-Pagoda-User";
// Longest accepted user id, in bytes.
inline constexpr size_t kMaxUserIdBytes = 256;

class ApiKeyStore {
 public:
  ApiKeyStore() = default;  // disabled: everyone is "default"
  // Errors name the file and the entry: NOT_FOUND, DATA_LOSS (bad JSON, missing
  // or empty "key"/"tenant", "admin" not a boolean, "user_salt" not a boolean
  // or "required", a bad or unknown "limits"
  // field, limits that differ between keys of one tenant, duplicate key).
  static StatusOr<ApiKeyStore> load(const std::filesystem::path& path);
  static StatusOr<ApiKeyStore> parse(std::string_view json_text, std::string_view source_name);

  bool enabled() const { return !entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Tenant for an Authorization header value ("Bearer sk-..."); nullopt if the
  // header is missing, malformed or the key is unknown. Keys are compared in
  // constant time. When disabled, always "default".
  std::optional<std::string> tenant_for_authorization(std::string_view header) const;
  // The same lookup with the key's rights; when disabled, {"default", admin}.
  std::optional<KeyIdentity> identify(std::string_view authorization_header) const;
  // The same, under the name the KV routes use.
  using Caller = KeyIdentity;
  std::optional<Caller> caller_for_authorization(std::string_view header) const { return identify(header); }

  // Every tenant with limits set in the file, once each.
  std::vector<std::pair<std::string, TenantLimits>> tenant_limits() const;
  // Every tenant of the file, once each ({"default"} when disabled).
  std::vector<std::string> tenants() const;

  // The KV namespace of a tenant: tenant names are user-chosen strings, so the
  // namespace is length-prefixed to keep "a" + "bc" apart from "ab" + "c".
  static std::string cache_namespace(std::string_view tenant);
  // The namespace of one user of a tenant (a salting key's X-Pagoda-User):
  // the tenant's namespace with the length-prefixed id appended, so no tenant
  // name or user id can alias another pair. An empty user is the tenant's own.
  static std::string cache_namespace(std::string_view tenant, std::string_view user);

 private:
  struct Entry {
    std::string key;
    KeyIdentity identity;
  };
  std::vector<Entry> entries_;
};

}  // namespace pagoda::server
