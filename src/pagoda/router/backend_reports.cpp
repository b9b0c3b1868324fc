#include "pagoda/router/backend_reports.h"

#include <charconv>

#include <nlohmann/json.hpp>

namespace pagoda::router {

namespace {

using json = nlohmann::json;

Status bad(std::string_view what) { return data_loss_error("backend report: {}", what); }

StatusOr<BackendLoad> load_from(const json& j) {
  if (!j.is_object()) return bad("load is not an object");
  for (const char* field : {"running", "waiting"})
    if (!j.contains(field) || !j[field].is_number_integer() || j[field].get<int64_t>() < 0)
      return bad(std::string("load.") + field + " must be a non-negative integer");
  if (!j.contains("kv_usage") || !j["kv_usage"].is_number()) return bad("load.kv_usage must be a number");
  BackendLoad out;
  out.running = j["running"].get<int64_t>();
  out.waiting = j["waiting"].get<int64_t>();
  out.kv_usage = j["kv_usage"].get<double>();
  if (j.contains("queued")) {  // newer replicas: requests accepted, not yet sequences
    if (!j["queued"].is_number_integer() || j["queued"].get<int64_t>() < 0)
      return bad("load.queued must be a non-negative integer");
    out.queued = j["queued"].get<int64_t>();
  }
  return out;
}

}  // namespace

std::optional<uint64_t> parse_hex64(std::string_view text) {
  if (text.empty() || text.size() > 16) return std::nullopt;
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

StatusOr<KvEventsPage> parse_kv_events_page(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("events page is not a JSON object");
  KvEventsPage page;
  if (!j.contains("instance") || !j["instance"].is_string()) return bad("instance must be a hex string");
  const auto instance = parse_hex64(j["instance"].get<std::string>());
  if (!instance || *instance == 0) return bad("instance must be a non-zero hex string");
  page.instance = *instance;
  if (!j.contains("block_size") || !j["block_size"].is_number_integer() || j["block_size"].get<int64_t>() < 1 ||
      j["block_size"].get<int64_t>() > 4096)
    return bad("block_size must be an integer in [1, 4096]");
  page.block_size = j["block_size"].get<int32_t>();
  for (const char* field : {"since", "last"})
    if (!j.contains(field) || !j[field].is_number_unsigned()) return bad(std::string(field) + " must be an unsigned integer");
  page.since = j["since"].get<uint64_t>();
  page.last = j["last"].get<uint64_t>();
  if (!j.contains("snapshot") || !j["snapshot"].is_boolean()) return bad("snapshot must be true or false");
  page.snapshot = j["snapshot"].get<bool>();
  page.more = j.contains("more") && j["more"].is_boolean() && j["more"].get<bool>();
  if (!j.contains("events") || !j["events"].is_array()) return bad("events must be an array");
  const json& events = j["events"];
  page.events.reserve(events.size());
  for (const json& e : events) {
    if (!e.is_object() || !e.contains("seq") || !e["seq"].is_number_unsigned() || !e.contains("type") ||
        !e["type"].is_string() || !e.contains("hash") || !e["hash"].is_string())
      return bad("an event lacks seq, type or hash");
    const std::string type = e["type"].get<std::string>();
    if (type != "stored" && type != "removed") return bad("event type must be stored or removed");
    const auto hash = parse_hex64(e["hash"].get<std::string>());
    if (!hash || *hash == 0) return bad("event hash must be a non-zero hex string");
    page.events.push_back(KvEventsPage::Event{e["seq"].get<uint64_t>(), type == "stored", *hash});
  }
  if (j.contains("load")) {
    PAGODA_ASSIGN_OR_RETURN(BackendLoad load, load_from(j["load"]));
    page.load = load;
  }
  return page;
}

StatusOr<BackendLoad> parse_backend_load(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("load is not JSON");
  return load_from(j);
}

}  // namespace pagoda::router
