#include "pagoda/server/api_error.h"

#include <nlohmann/json.hpp>

namespace pagoda::server {

std::string ApiError::body() const {
  std::string msg = message;
  if (msg.size() > kMaxMessageBytes) {
    msg.resize(kMaxMessageBytes);
    msg += "...";
  }
  nlohmann::json error = {{"message", msg}, {"type", type}, {"code", code}};
  error["param"] = param ? nlohmann::json(*param) : nlohmann::json(nullptr);
  // replace: a message quoting invalid UTF-8 from the client must not throw.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError invalid_request(std::string message, std::optional<std::string> param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError api_error_from_status(const Status& status, std::optional<std::string> param) {
  ApiError e;
  e.message = status.message();
  e.param = std::move(param);
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      break;
    case StatusCode::kFailedPrecondition:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "unavailable";
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 400;
      e.code = "unsupported";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      break;
  }
  return e;
}

ApiError api_error_from_engine_failure(const std::string& engine_error) {
  ApiError e;
  e.message = engine_error;
  e.type = "server_error";
  // The engine reports failures as text (RequestOutput::error); this is its
  // wording for a request the scheduler can never place (engine.cpp).
  if (engine_error.find("does not fit in the KV cache") != std::string::npos) {
    e.http_status = 503;
    e.code = "kv_cache_capacity";
  } else {
    e.http_status = 500;
    e.code = "internal_error";
  }
  return e;
}

}  // namespace pagoda::server
