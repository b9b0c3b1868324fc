#pragma once
// The OpenAI error object and the HTTP status that goes with it:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Bad input is always 4xx with this body; 5xx only for the server's own faults.
// Bodies are bounded: messages are cut to kMaxMessageBytes so echoing a huge
// or hostile value can never blow up a response.
//
// Thread safety: values.

#include <optional>
#include <string>

#include "pagoda/core/status.h"

namespace pagoda::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;  // the offending field, e.g. "temperature"
  std::string code = "invalid_value";

  static constexpr size_t kMaxMessageBytes = 1024;

  // Serialized error object (valid UTF-8 whatever the message holds).
  std::string body() const;
};

ApiError invalid_request(std::string message, std::optional<std::string> param = std::nullopt,
                         std::string code = "invalid_value");
// Maps a Status refused before generation (engine submit(), tokenizer, ...):
// kInvalidArgument / kOutOfRange -> 400, kUnimplemented -> 400 "unsupported",
// kResourceExhausted -> 429 "queue_full", kFailedPrecondition -> 503
// "unavailable", everything else -> 500. The caller adds param / code where it
// knows them (a kOutOfRange from submit() is "context_length_exceeded").
ApiError api_error_from_status(const Status& status, std::optional<std::string> param = std::nullopt);
// A generation the engine failed after admission (RequestOutput::failure(),
// codes in engine/request.h), decided by the code alone; the message is passed
// through as it is:
//   kFailedPrecondition -> 503 "kv_cache_capacity" (the request can never fit the KV cache)
//   kCancelled          -> 503 "unavailable"       (the engine shut down under it)
//   anything else       -> 500 "internal_error"    (the model step failed)
// All are type "server_error": the request itself was valid.
ApiError api_error_from_engine_failure(const Status& failure);

}  // namespace pagoda::server
