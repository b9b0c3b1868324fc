#pragma once
// What a `pagoda serve` replica reports to the router, parsed from its JSON
// (the formats are in server/kv_routes.h): a page of KV block events
// (GET /v1/kv/events) and its load (GET /v1/load, or the "load" object of an
// events page). A body that does not have the documented shape is a
// kDataLoss naming the field: the router then ignores the report rather than
// trusting half of it.
//
// Thread safety: values and pure functions.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "pagoda/core/status.h"

namespace pagoda::router {

struct BackendLoad {
  int64_t running = 0;
  int64_t waiting = 0;  // sequences waiting, incl. preempted ones
  int64_t queued = 0;   // requests accepted and not yet started (0 if not reported)
  double kv_usage = 0.0;  // blocks referenced by sequences / all blocks
};

struct KvEventsPage {
  struct Event {
    uint64_t sequence_number = 0;
    bool stored = true;  // false: removed
    uint64_t key_hash = 0;
  };
  uint64_t instance = 0;   // the replica process; changes on restart
  int32_t block_size = 0;  // tokens per block: the router hashes prompts with it
  uint64_t since = 0;
  uint64_t last = 0;
  bool snapshot = false;   // events is every cached block: replace the index
  bool more = false;
  std::vector<Event> events;
  std::optional<BackendLoad> load;  // present for an admin key
};

StatusOr<KvEventsPage> parse_kv_events_page(std::string_view body);
StatusOr<BackendLoad> parse_backend_load(std::string_view body);
// "0123456789abcdef" -> value; nullopt unless exactly 1..16 lowercase or uppercase hex digits.
std::optional<uint64_t> parse_hex64(std::string_view text);

}  // namespace pagoda::router
