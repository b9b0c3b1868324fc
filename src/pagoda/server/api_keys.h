#pragma once
// Api keys -> tenants. `--api-keys FILE` holds
//   {"keys": [{"key": "sk-...", "tenant": "name"}, {"key": "sk-ops", "tenant": "ops", "admin": true}, ...]}
// With keys loaded, every /v1 request needs `Authorization: Bearer <key>`; the
// tenant of the key becomes the request's KV cache namespace. The namespace
// never comes from the request body. Without keys every request is the tenant
// "default" (one shared namespace).
//
// An admin key (optional "admin": true) may also read what spans tenants: the
// KV events of every namespace and the load figures (a router polls with one).
// It still generates inside its own tenant's namespace. Without keys everyone
// is admin: there is only one tenant.
//
// Thread safety: immutable after load; lookups from any thread.

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::server {

class ApiKeyStore {
 public:
  ApiKeyStore() = default;  // disabled: everyone is "default"
  // Errors name the file and the entry: NOT_FOUND, DATA_LOSS (bad JSON, missing
  // or empty "key"/"tenant", duplicate key).
  static StatusOr<ApiKeyStore> load(const std::filesystem::path& path);
  static StatusOr<ApiKeyStore> parse(std::string_view json_text, std::string_view source_name);

  bool enabled() const { return !entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Tenant for an Authorization header value ("Bearer sk-..."); nullopt if the
  // header is missing, malformed or the key is unknown. Keys are compared in
  // constant time. When disabled, always "default".
  std::optional<std::string> tenant_for_authorization(std::string_view header) const;

  struct Caller {
    std::string tenant;
    bool admin = false;
  };
  // Tenant and admin right for an Authorization header value; nullopt as for
  // tenant_for_authorization. When disabled, always {"default", admin}.
  std::optional<Caller> caller_for_authorization(std::string_view header) const;

  // The KV namespace of a tenant: tenant names are user-chosen strings, so the
  // namespace is length-prefixed to keep "a" + "bc" apart from "ab" + "c".
  static std::string cache_namespace(std::string_view tenant);

 private:
  struct Entry {
    std::string key;
    std::string tenant;
    bool admin = false;
  };
  std::vector<Entry> entries_;
};

}  // namespace pagoda::server
