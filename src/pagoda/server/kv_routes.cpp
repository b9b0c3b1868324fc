#include "pagoda/server/kv_routes.h"

#include <charconv>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "pagoda/kv/prefix_cache.h"
#include "pagoda/server/api_error.h"

namespace pagoda::server {

namespace {

using json = nlohmann::json;

constexpr uint64_t kDefaultMaxEvents = 4096;
constexpr uint64_t kMaxMaxEvents = 65536;

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.body(), "application/json");
}

// The caller, or nullopt after answering 401.
std::optional<ApiKeyStore::Caller> authenticate(const KvRoutesContext& ctx, const httplib::Request& req,
                                                httplib::Response& res) {
  auto caller = ctx.api_keys->caller_for_authorization(req.get_header_value("Authorization"));
  if (!caller) {
    ApiError e;
    e.http_status = 401;
    e.type = "authentication_error";
    e.code = "invalid_api_key";
    e.message = req.has_header("Authorization") ? "invalid api key"
                                                : "missing api key: send 'Authorization: Bearer <key>'";
    send_error(res, e);
  }
  return caller;
}

bool refuse_while_draining(const KvRoutesContext& ctx, httplib::Response& res) {
  if (!ctx.draining->load()) return false;
  send_error(res, api_error_from_status(failed_precondition_error("the server is shutting down")));
  return true;
}

// A query parameter as an unsigned integer in [min, max]; fallback when absent.
std::optional<uint64_t> uint_param(const httplib::Request& req, const char* name, uint64_t fallback, uint64_t min,
                                   uint64_t max, httplib::Response& res) {
  if (!req.has_param(name)) return fallback;
  const std::string text = req.get_param_value(name);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || value < min || value > max) {
    send_error(res, invalid_request(fmt::format("{} must be an integer in [{}, {}], got '{}'", name, min, max,
                                                text.substr(0, 64)),
                                    name));
    return std::nullopt;
  }
  return value;
}

json load_json(const engine::Engine& engine) {
  const engine::EngineStats s = engine.stats();
  const double usage = s.kv.blocks_total > 0 ? static_cast<double>(s.kv.blocks_in_use) / s.kv.blocks_total : 0.0;
  return {{"running", s.num_running},          {"waiting", s.num_waiting},
          {"queued", s.num_queued_requests},   {"kv_blocks_total", s.kv.blocks_total},
          {"kv_blocks_in_use", s.kv.blocks_in_use}, {"kv_usage", usage}};
}

void handle_events(const KvRoutesContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto caller = authenticate(ctx, req, res);
  if (!caller || refuse_while_draining(ctx, res)) return;
  if (ctx.feed == nullptr) {
    ApiError e;
    e.http_status = 404;
    e.code = "kv_events_disabled";
    e.message = "this server publishes no KV events (it was started with --no-kv-events)";
    return send_error(res, e);
  }
  const auto since = uint_param(req, "since", 0, 0, UINT64_MAX, res);
  if (!since) return;
  const auto max_events = uint_param(req, "max_events", kDefaultMaxEvents, 1, kMaxMaxEvents, res);
  if (!max_events) return;
  std::optional<std::string> only_namespace;
  if (!caller->admin) only_namespace = ApiKeyStore::cache_namespace(caller->tenant);
  const KvFeedPage page = ctx.feed->read(*since, only_namespace, *max_events);

  json events = json::array();
  for (const KvFeedEvent& e : page.events)
    events.push_back({{"seq", e.sequence_number},
                      {"type", e.stored ? "stored" : "removed"},
                      {"hash", hex(e.key_hash)},
                      {"parent", e.parent_key_hash == 0 ? json(nullptr) : json(hex(e.parent_key_hash))}});
  json body = {{"object", "kv.events"},    {"instance", hex(ctx.feed->instance_id())},
               {"block_size", ctx.block_size}, {"since", page.since},
               {"last", page.last},        {"snapshot", page.snapshot},
               {"more", page.more},        {"scope", caller->admin ? "all" : "tenant"},
               {"events", std::move(events)}};
  if (caller->admin) body["load"] = load_json(*ctx.engine);
  send_json(res, 200, body);
}

void handle_namespace(const KvRoutesContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto caller = authenticate(ctx, req, res);
  if (!caller) return;
  const uint64_t seed = kv::namespace_seed(ApiKeyStore::cache_namespace(caller->tenant));
  send_json(res, 200, {{"object", "kv.namespace"}, {"namespace_seed", hex(seed)}, {"block_size", ctx.block_size}});
}

void handle_load(const KvRoutesContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto caller = authenticate(ctx, req, res);
  if (!caller) return;
  if (!caller->admin) {
    ApiError e;
    e.http_status = 403;
    e.type = "permission_error";
    e.code = "admin_key_required";
    e.message = "load figures span tenants: an admin api key is needed";
    return send_error(res, e);
  }
  json body = load_json(*ctx.engine);
  body["object"] = "load";
  send_json(res, 200, body);
}

}  // namespace

void install_kv_routes(httplib::Server& http, KvRoutesContext context) {
  http.Get("/v1/kv/events",
           [context](const httplib::Request& req, httplib::Response& res) { handle_events(context, req, res); });
  http.Get("/v1/kv/namespace",
           [context](const httplib::Request& req, httplib::Response& res) { handle_namespace(context, req, res); });
  http.Get("/v1/load",
           [context](const httplib::Request& req, httplib::Response& res) { handle_load(context, req, res); });
}

}  // namespace pagoda::server
