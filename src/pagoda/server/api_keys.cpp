#include "pagoda/server/api_keys.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

namespace pagoda::server {

StatusOr<ApiKeyStore> ApiKeyStore::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("api keys file {}: cannot be opened", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse(buffer.str(), path.string());
}

namespace {

StatusOr<TenantLimits> parse_limits(const nlohmann::json& j, std::string_view source_name, size_t index) {
  if (!j.is_object()) return data_loss_error("api keys file {}: keys[{}].limits must be an object", source_name, index);
  TenantLimits limits;
  for (const auto& [name, value] : j.items()) {
    if (name == "min_priority") {
      if (!value.is_number_integer() || value.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          value.get<int64_t>() > std::numeric_limits<int32_t>::max())
        return data_loss_error("api keys file {}: keys[{}].limits.min_priority must be a 32-bit integer",
                               source_name, index);
      limits.min_priority = static_cast<int32_t>(value.get<int64_t>());
      continue;
    }
    int64_t* wide = nullptr;
    int32_t* narrow = nullptr;
    if (name == "max_requests_in_flight") narrow = &limits.max_requests_in_flight;
    else if (name == "tokens_per_minute") wide = &limits.tokens_per_minute;
    else if (name == "max_kv_blocks") narrow = &limits.max_kv_blocks;
    else
      return data_loss_error("api keys file {}: keys[{}].limits.{} is not a limit (max_requests_in_flight, "
                             "tokens_per_minute, max_kv_blocks, min_priority)",
                             source_name, index, name.substr(0, 64));
    const int64_t most = narrow ? std::numeric_limits<int32_t>::max() : (int64_t{1} << 53);
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > most)
      return data_loss_error("api keys file {}: keys[{}].limits.{} must be an integer in [0, {}]", source_name, index,
                             name, most);
    if (narrow) *narrow = static_cast<int32_t>(value.get<int64_t>());
    else *wide = value.get<int64_t>();
  }
  return limits;
}

}  // namespace

StatusOr<ApiKeyStore> ApiKeyStore::parse(std::string_view json_text, std::string_view source_name) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return data_loss_error("api keys file {}: not valid JSON", source_name);
  if (!doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array())
    return data_loss_error("api keys file {}: expected {{\"keys\": [{{\"key\": ..., \"tenant\": ...}}]}}", source_name);
  ApiKeyStore store;
  const auto& keys = doc["keys"];
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& k = keys[i];
    if (!k.is_object() || !k.contains("key") || !k["key"].is_string() || k["key"].get<std::string>().empty())
      return data_loss_error("api keys file {}: keys[{}].key must be a non-empty string", source_name, i);
    if (!k.contains("tenant") || !k["tenant"].is_string() || k["tenant"].get<std::string>().empty())
      return data_loss_error("api keys file {}: keys[{}].tenant must be a non-empty string", source_name, i);
    if (k.contains("admin") && !k["admin"].is_boolean())
      return data_loss_error("api keys file {}: keys[{}].admin must be true or false", source_name, i);
    Entry e{k["key"].get<std::string>(), KeyIdentity{k["tenant"].get<std::string>(), k.value("admin", false), {}}};
    if (k.contains("user_salt")) {
      const auto& salt = k["user_salt"];
      if (salt.is_boolean())
        e.identity.user_salt = salt.get<bool>() ? UserSalt::kAllowed : UserSalt::kNotAllowed;
      else if (salt.is_string() && salt.get<std::string>() == "required")
        e.identity.user_salt = UserSalt::kRequired;
      else
        return data_loss_error("api keys file {}: keys[{}].user_salt must be true, false or \"required\"", source_name,
                               i);
    }
    if (k.contains("limits")) {
      auto limits = parse_limits(k["limits"], source_name, i);
      if (!limits.ok()) return limits.status();
      e.identity.limits = *limits;
    }
    for (const auto& existing : store.entries_) {
      if (existing.key == e.key) return data_loss_error("api keys file {}: keys[{}] repeats a key", source_name, i);
      if (existing.identity.tenant == e.identity.tenant && existing.identity.limits && e.identity.limits &&
          !(*existing.identity.limits == *e.identity.limits))
        return data_loss_error("api keys file {}: keys[{}] sets other limits for tenant '{}' than an earlier key",
                               source_name, i, e.identity.tenant.substr(0, 64));
    }
    store.entries_.push_back(std::move(e));
  }
  if (store.entries_.empty()) return data_loss_error("api keys file {}: \"keys\" is empty", source_name);
  // Limits belong to the tenant: a key of it without "limits" gets its other keys' ones.
  for (auto& e : store.entries_)
    if (!e.identity.limits)
      for (const auto& other : store.entries_)
        if (other.identity.tenant == e.identity.tenant && other.identity.limits) e.identity.limits = other.identity.limits;
  return store;
}

std::optional<std::string> ApiKeyStore::tenant_for_authorization(std::string_view header) const {
  auto identity = identify(header);
  if (!identity) return std::nullopt;
  return std::move(identity->tenant);
}

std::optional<KeyIdentity> ApiKeyStore::identify(std::string_view header) const {
  // Without keys every caller is one trust domain: all are admin and may salt.
  if (!enabled()) return KeyIdentity{"default", true, {}, UserSalt::kAllowed};
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.size() <= kPrefix.size() || header.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view presented = header.substr(kPrefix.size());
  const Entry* found = nullptr;
  // Check every entry with a constant-time compare so timing does not reveal
  // how much of a key matched.
  for (const auto& e : entries_) {
    if (e.key.size() == presented.size() && CRYPTO_memcmp(e.key.data(), presented.data(), presented.size()) == 0)
      found = &e;
  }
  if (found == nullptr) return std::nullopt;
  return found->identity;
}

std::vector<std::pair<std::string, TenantLimits>> ApiKeyStore::tenant_limits() const {
  std::vector<std::pair<std::string, TenantLimits>> out;
  for (const auto& e : entries_) {
    if (!e.identity.limits) continue;
    bool seen = false;
    for (const auto& [tenant, limits] : out) seen |= tenant == e.identity.tenant;
    if (!seen) out.emplace_back(e.identity.tenant, *e.identity.limits);
  }
  return out;
}

std::vector<std::string> ApiKeyStore::tenants() const {
  if (!enabled()) return {"default"};
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (std::find(out.begin(), out.end(), e.identity.tenant) == out.end()) out.push_back(e.identity.tenant);
  return out;
}

std::string ApiKeyStore::cache_namespace(std::string_view tenant) {
  return fmt::format("tenant:{}:{}", tenant.size(), tenant);
}

std::string ApiKeyStore::cache_namespace(std::string_view tenant, std::string_view user) {
  if (user.empty()) return cache_namespace(tenant);
  return fmt::format("tenant:{}:{}/user:{}:{}", tenant.size(), tenant, user.size(), user);
}

}  // namespace pagoda::server
