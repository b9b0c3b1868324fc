#pragma once
// NamespaceSeeds: the KV namespace seed behind each api key (and, for a key
// with the user_salt right, each X-Pagoda-User it names), learned from the
// backends (GET /v1/kv/namespace with the client's own Authorization and
// X-Pagoda-User headers), so that the router hashes a prompt into the keys the
// backend will use: a salted user's turns land where that user's prefix is
// cached. The router never learns tenant names: the backend maps key (+ user)
// -> tenant -> namespace and answers only the seed (a hash of the namespace).
//
// Answers are cached by a hash of the two header values (the key itself is not
// kept): successes until the cache is full (then it starts over), failures
// (a key the backends refuse) for 10 s, so a bad key costs one lookup per
// 10 s, not one per request; no answer at all (the backend is unreachable) is
// not remembered.
//
// Thread safety: seed_for() from any thread; two first requests of one key may
// both look it up.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "pagoda/router/backend.h"

namespace pagoda::router {

class NamespaceSeeds {
 public:
  explicit NamespaceSeeds(size_t max_entries = 4096) : max_entries_(max_entries) {}

  // `authorization`, `user`: the request's Authorization and X-Pagoda-User
  // header values ("" when absent). A user the key may not name gets no seed
  // (the backend refuses it, as it will refuse the request itself).
  std::optional<uint64_t> seed_for(const std::string& authorization, const std::string& user, Backend& backend);

  int64_t lookups() const;

 private:
  struct Entry {
    std::optional<uint64_t> seed;
    std::chrono::steady_clock::time_point expires;  // failures only
  };
  struct Answer {
    std::optional<uint64_t> seed;
    bool definitive = false;  // false: no answer (transport), not worth remembering
  };
  Answer look_up(const std::string& authorization, const std::string& user, Backend& backend);

  const size_t max_entries_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> entries_;
  int64_t lookups_ = 0;
};

}  // namespace pagoda::router
