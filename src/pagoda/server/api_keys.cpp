#include "pagoda/server/api_keys.h"

#include <fstream>
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
    Entry e{k["key"].get<std::string>(), k["tenant"].get<std::string>(), k.value("admin", false)};
    for (const auto& existing : store.entries_)
      if (existing.key == e.key) return data_loss_error("api keys file {}: keys[{}] repeats a key", source_name, i);
    store.entries_.push_back(std::move(e));
  }
  if (store.entries_.empty()) return data_loss_error("api keys file {}: \"keys\" is empty", source_name);
  return store;
}

std::optional<std::string> ApiKeyStore::tenant_for_authorization(std::string_view header) const {
  auto caller = caller_for_authorization(header);
  if (!caller) return std::nullopt;
  return std::move(caller->tenant);
}

std::optional<ApiKeyStore::Caller> ApiKeyStore::caller_for_authorization(std::string_view header) const {
  if (!enabled()) return Caller{"default", true};
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.size() <= kPrefix.size() || header.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view presented = header.substr(kPrefix.size());
  std::optional<Caller> caller;
  // Check every entry with a constant-time compare so timing does not reveal
  // how much of a key matched.
  for (const auto& e : entries_) {
    if (e.key.size() == presented.size() && CRYPTO_memcmp(e.key.data(), presented.data(), presented.size()) == 0)
      caller = Caller{e.tenant, e.admin};
  }
  return caller;
}

std::string ApiKeyStore::cache_namespace(std::string_view tenant) {
  return fmt::format("tenant:{}:{}", tenant.size(), tenant);
}

}  // namespace pagoda::server
