#include "pagoda/router/namespace_seeds.h"

#include <functional>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/server/api_keys.h"

namespace pagoda::router {

namespace {
constexpr auto kFailureMemory = std::chrono::seconds(10);
constexpr auto kLookupTimeout = std::chrono::seconds(2);
}  // namespace

int64_t NamespaceSeeds::lookups() const {
  std::lock_guard lock(mutex_);
  return lookups_;
}

NamespaceSeeds::Answer NamespaceSeeds::look_up(const std::string& authorization, const std::string& user,
                                               Backend& backend) {
  auto lease = backend.pool().acquire(kLookupTimeout);
  if (!lease) return Answer{};
  httplib::Client& client = lease->client();
  client.set_read_timeout(std::chrono::duration_cast<std::chrono::seconds>(kLookupTimeout).count(), 0);
  httplib::Headers headers;
  if (!authorization.empty()) headers.emplace("Authorization", authorization);
  if (!user.empty()) headers.emplace(std::string(server::kUserSaltHeader), user);
  auto res = client.Get("/v1/kv/namespace", headers);
  if (!res) {
    lease->discard();
    return Answer{};
  }
  if (res->status != 200) return Answer{std::nullopt, true};
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (!j.is_object() || !j.contains("namespace_seed") || !j["namespace_seed"].is_string()) return Answer{std::nullopt, true};
  return Answer{parse_hex64(j["namespace_seed"].get<std::string>()), true};
}

std::optional<uint64_t> NamespaceSeeds::seed_for(const std::string& authorization, const std::string& user,
                                                 Backend& backend) {
  // The NUL cannot occur in a header value, so (key, user) pairs never collide by concatenation.
  const uint64_t key = std::hash<std::string>{}(authorization + '\0' + user);
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(key);
    if (it != entries_.end() && (it->second.seed || now < it->second.expires)) return it->second.seed;
  }
  const Answer answer = look_up(authorization, user, backend);
  std::lock_guard lock(mutex_);
  ++lookups_;
  if (!answer.definitive) return std::nullopt;  // the backend did not answer: ask again next time
  if (entries_.size() >= max_entries_) entries_.clear();
  entries_[key] = Entry{answer.seed, now + kFailureMemory};
  return answer.seed;
}

}  // namespace pagoda::router
