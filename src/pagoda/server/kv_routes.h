#pragma once
// The server's routes for a KV-aware router (pagoda extensions, JSON):
//
//   GET /v1/kv/events?since=N[&max_events=M]   block events after event N (kv_event_feed.h)
//     {"object": "kv.events", "instance": "<hex>", "block_size": 16, "since": N, "last": L,
//      "snapshot": false, "more": false, "scope": "all" | "tenant",
//      "events": [{"seq": 7, "type": "stored" | "removed", "hash": "<hex>", "parent": "<hex>" | null}],
//      "load": {...}}                                   (load: admin callers only, as /v1/load)
//     With "snapshot": true, "events" is every block cached now (all "stored", "seq" 0, parents
//     first): replace what you held. Continue with since=L. A new "instance" is a new process:
//     start again from since=0. An admin key (or no --api-keys) sees every namespace ("scope":
//     "all"); any other key only its own tenant's blocks ("tenant").
//   GET /v1/kv/namespace   the caller's namespace seed, to hash prompts as the server does:
//     {"object": "kv.namespace", "namespace_seed": "<hex>", "block_size": 16}
//     block i of a prompt has key chain_block_hash(key of block i-1, its tokens), key of block -1 =
//     the seed (kv/prefix_cache.h); the server matches at most (prompt length - 1) / block_size blocks.
//   GET /v1/load   admin only: {"object": "load", "running": r, "waiting": w, "queued": q,
//     "kv_blocks_total": t, "kv_blocks_in_use": u, "kv_usage": u / t}
//
// Hashes are 16 lowercase hex digits. Errors use the OpenAI error object: 401 bad key, 403 a
// non-admin key on /v1/load, 400 a bad since/max_events (named in "param"), 404 when the server
// publishes no events (serve --no-kv-events), 503 while draining.
//
// Thread safety: the handlers run on the HTTP front's workers; everything they touch is thread-safe.

#include <atomic>
#include <cstdint>

#include "pagoda/engine/engine.h"
#include "pagoda/server/api_keys.h"
#include "pagoda/server/http_front.h"
#include "pagoda/server/kv_event_feed.h"

namespace pagoda::server {

struct KvRoutesContext {
  const ApiKeyStore* api_keys = nullptr;
  engine::Engine* engine = nullptr;
  KvEventFeed* feed = nullptr;  // nullptr: no events published (404)
  int32_t block_size = 0;
  const std::atomic<bool>* draining = nullptr;
};

// Every object in `context` must outlive the server.
void install_kv_routes(HttpFront& front, KvRoutesContext context);

}  // namespace pagoda::server
