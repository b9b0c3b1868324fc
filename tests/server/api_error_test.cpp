// api_error_from_engine_failure decides the HTTP status by the engine's
// StatusCode alone (engine/request.h) and passes the message through: the
// capacity code is 503 "kv_cache_capacity", a shutdown 503 "unavailable",
// everything else 500, whatever the message says.

#include "pagoda/server/api_error.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pagoda::server {
namespace {

using json = nlohmann::json;

std::string body_message(const ApiError& e) { return json::parse(e.body())["error"]["message"]; }

TEST(ApiErrorTest, KvCapacityFailureIs503WithItsCodeAndTheMessagePassedThrough) {
  const std::string message = "the request's 300 tokens can never fit in the KV cache";
  ApiError e = api_error_from_engine_failure(Status(StatusCode::kFailedPrecondition, message));
  EXPECT_EQ(e.http_status, 503);
  EXPECT_EQ(e.type, "server_error");
  EXPECT_EQ(e.code, "kv_cache_capacity");
  EXPECT_EQ(e.message, message);
  EXPECT_EQ(body_message(e), message);
  EXPECT_EQ(json::parse(e.body())["error"]["code"], "kv_cache_capacity");
}

TEST(ApiErrorTest, ModelFailureIs500InternalError) {
  ApiError e = api_error_from_engine_failure(internal_error("model step failed: CUDA error 700"));
  EXPECT_EQ(e.http_status, 500);
  EXPECT_EQ(e.type, "server_error");
  EXPECT_EQ(e.code, "internal_error");
  EXPECT_EQ(body_message(e), "model step failed: CUDA error 700");
}

TEST(ApiErrorTest, ShutdownCancellationIs503Unavailable) {
  ApiError e = api_error_from_engine_failure(cancelled_error("the engine shut down before the request finished"));
  EXPECT_EQ(e.http_status, 503);
  EXPECT_EQ(e.code, "unavailable");
  EXPECT_EQ(body_message(e), "the engine shut down before the request finished");
}

TEST(ApiErrorTest, RewordingTheMessageNeverChangesTheStatus) {
  // The capacity code with any wording, even none, is still the capacity error...
  for (const std::string message : {"", "no room", "KV pool too small for this prompt", "model step failed"}) {
    ApiError e = api_error_from_engine_failure(Status(StatusCode::kFailedPrecondition, message));
    EXPECT_EQ(e.http_status, 503) << message;
    EXPECT_EQ(e.code, "kv_cache_capacity") << message;
    EXPECT_EQ(e.message, message);
  }
  // ...and the old capacity wording under another code is not.
  for (StatusCode code : {StatusCode::kInternal, StatusCode::kUnimplemented, StatusCode::kDataLoss}) {
    ApiError e = api_error_from_engine_failure(Status(code, "the request does not fit in the KV cache"));
    EXPECT_EQ(e.http_status, 500) << status_code_name(code);
    EXPECT_EQ(e.code, "internal_error") << status_code_name(code);
  }
}

TEST(ApiErrorTest, CodesTheEngineDoesNotSetAfterAdmissionAre500) {
  // kResourceExhausted is submit()'s full queue (429 through api_error_from_status),
  // never a failure after admission: if one ever arrives it is the server's fault.
  for (StatusCode code : {StatusCode::kResourceExhausted, StatusCode::kInvalidArgument, StatusCode::kNotFound,
                          StatusCode::kOutOfRange, StatusCode::kIoError}) {
    ApiError e = api_error_from_engine_failure(Status(code, "something"));
    EXPECT_EQ(e.http_status, 500) << status_code_name(code);
    EXPECT_EQ(e.type, "server_error") << status_code_name(code);
    EXPECT_EQ(e.code, "internal_error") << status_code_name(code);
  }
}

}  // namespace
}  // namespace pagoda::server
