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

ApiError api_error_from_engine_failure(const Status& failure) {
  ApiError e;
  e.message = failure.message();
  e.type = "server_error";
  switch (failure.code()) {
    case StatusCode::kFailedPrecondition:
      e.http_status = 503;
      e.code = "kv_cache_capacity";
      break;
    case StatusCode::kCancelled:
      e.http_status = 503;
      e.code = "unavailable";
      break;
    default:
      e.http_status = 500;
      e.code = "internal_error";
      break;
  }
  return e;
}

}  // namespace pagoda::server
