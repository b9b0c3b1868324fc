#include "pagoda/server/kv_routes.h"

#include <charconv>
#include <optional>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/kv/prefix_cache.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/user_salt.h"

namespace pagoda::server {

namespace {

using json = nlohmann::json;

constexpr uint64_t kDefaultMaxEvents = 4096;
constexpr uint64_t kMaxMaxEvents = 65536;

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

HttpReply json_reply(int status, const json& body) {
  HttpReply r;
  r.response.status = status;
  r.response.body = body.dump();
  return r;
}

HttpReply error_reply(const ApiError& e) {
  HttpReply r;
  r.response.status = e.http_status;
  r.response.body = e.body();
  return r;
}

// The caller, or the 401 to answer.
std::variant<ApiKeyStore::Caller, HttpReply> authenticate(const KvRoutesContext& ctx, const HttpRequest& req) {
  auto caller = ctx.api_keys->caller_for_authorization(req.header("Authorization"));
  if (caller) return std::move(*caller);
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message = req.has_header("Authorization") ? "invalid api key" : "missing api key: send 'Authorization: Bearer <key>'";
  return error_reply(e);
}

std::optional<HttpReply> refuse_while_draining(const KvRoutesContext& ctx) {
  if (!ctx.draining->load()) return std::nullopt;
  return error_reply(api_error_from_status(failed_precondition_error("the server is shutting down")));
}

// A query parameter as an unsigned integer in [min, max]; fallback when absent.
std::variant<uint64_t, HttpReply> uint_param(const HttpRequest& req, const char* name, uint64_t fallback, uint64_t min,
                                             uint64_t max) {
  const std::optional<std::string> text = req.query_param(name);
  if (!text) return fallback;
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || text->empty() || value < min || value > max) {
    return error_reply(invalid_request(
        fmt::format("{} must be an integer in [{}, {}], got '{}'", name, min, max, text->substr(0, 64)), name));
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

HttpReply handle_events(const KvRoutesContext& ctx, const HttpRequest& req) {
  auto caller = authenticate(ctx, req);
  if (auto* refused = std::get_if<HttpReply>(&caller)) return std::move(*refused);
  if (auto draining = refuse_while_draining(ctx)) return std::move(*draining);
  const auto& who = std::get<ApiKeyStore::Caller>(caller);
  // X-Pagoda-User is checked as everywhere (403 without the right, 400 when
  // malformed), never silently ignored; the feed's scope is the whole tenant
  // group either way (kv_event_feed.h).
  if (auto ns = request_namespace(who, req); std::holds_alternative<ApiError>(ns))
    return error_reply(std::get<ApiError>(ns));
  if (ctx.feed == nullptr) {
    ApiError e;
    e.http_status = 404;
    e.code = "kv_events_disabled";
    e.message = "this server publishes no KV events (it was started with --no-kv-events)";
    return error_reply(e);
  }
  const auto since = uint_param(req, "since", 0, 0, UINT64_MAX);
  if (auto* bad = std::get_if<HttpReply>(&since)) return std::move(*bad);
  const auto max_events = uint_param(req, "max_events", kDefaultMaxEvents, 1, kMaxMaxEvents);
  if (auto* bad = std::get_if<HttpReply>(&max_events)) return std::move(*bad);
  std::optional<std::string> only_namespace;
  if (!who.admin) only_namespace = ApiKeyStore::cache_namespace(who.tenant);
  const KvFeedPage page = ctx.feed->read(std::get<uint64_t>(since), only_namespace, std::get<uint64_t>(max_events));

  json events = json::array();
  for (const KvFeedEvent& e : page.events)
    events.push_back({{"seq", e.sequence_number},
                      {"type", e.stored ? "stored" : "removed"},
                      {"hash", hex(e.key_hash)},
                      {"parent", e.parent_key_hash == 0 ? json(nullptr) : json(hex(e.parent_key_hash))}});
  json body = {{"object", "kv.events"},    {"instance", hex(ctx.feed->instance_id())},
               {"block_size", ctx.block_size}, {"since", page.since},
               {"last", page.last},        {"snapshot", page.snapshot},
               {"more", page.more},        {"scope", who.admin ? "all" : "tenant"},
               {"events", std::move(events)}};
  if (who.admin) body["load"] = load_json(*ctx.engine);
  return json_reply(200, body);
}

HttpReply handle_namespace(const KvRoutesContext& ctx, const HttpRequest& req) {
  auto caller = authenticate(ctx, req);
  if (auto* refused = std::get_if<HttpReply>(&caller)) return std::move(*refused);
  // The seed of the namespace a completion with the same headers would use:
  // with X-Pagoda-User (a salting key), that user's.
  auto ns = request_namespace(std::get<ApiKeyStore::Caller>(caller), req);
  if (auto* bad = std::get_if<ApiError>(&ns)) return error_reply(*bad);
  const uint64_t seed = kv::namespace_seed(std::get<RequestNamespace>(ns).cache_namespace);
  return json_reply(200, {{"object", "kv.namespace"}, {"namespace_seed", hex(seed)}, {"block_size", ctx.block_size}});
}

HttpReply handle_load(const KvRoutesContext& ctx, const HttpRequest& req) {
  auto caller = authenticate(ctx, req);
  if (auto* refused = std::get_if<HttpReply>(&caller)) return std::move(*refused);
  if (!std::get<ApiKeyStore::Caller>(caller).admin) {
    ApiError e;
    e.http_status = 403;
    e.type = "permission_error";
    e.code = "admin_key_required";
    e.message = "load figures span tenants: an admin api key is needed";
    return error_reply(e);
  }
  json body = load_json(*ctx.engine);
  body["object"] = "load";
  return json_reply(200, body);
}

}  // namespace

void install_kv_routes(HttpFront& front, KvRoutesContext context) {
  front.route("GET", "/v1/kv/events", RouteRuns::kOnWorker,
              [context](HttpRequest& req) { return handle_events(context, req); });
  front.route("GET", "/v1/kv/namespace", RouteRuns::kOnWorker,
              [context](HttpRequest& req) { return handle_namespace(context, req); });
  front.route("GET", "/v1/load", RouteRuns::kOnWorker, [context](HttpRequest& req) { return handle_load(context, req); });
}

}  // namespace pagoda::server
