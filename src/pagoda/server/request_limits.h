#pragma once
// Checks on a request that are about its shape and cost rather than its
// meaning: the media type of a JSON body, and the most work one request may
// ask for. Each failure is an ApiError in the OpenAI shape naming what to fix.
//
// Thread safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pagoda/engine/sampling_params.h"
#include "pagoda/server/api_error.h"

namespace pagoda::server {

// JSON endpoints accept only `application/json` (any parameters, e.g.
// charset=utf-8; the type is case-insensitive). Anything else, or no
// Content-Type, is 415 "unsupported_media_type": a web page can send
// text/plain, form or multipart bodies to a local server without the
// browser's CORS preflight, but never application/json.
std::optional<ApiError> check_json_content_type(std::string_view content_type);

// What one request may cost, in generated token-units: n choices x max_tokens
// x (1 + top_logprobs entries per token). It bounds the decode work and the
// size of the response one short request can demand.
int64_t request_cost(const engine::SamplingParams& sampling);
inline constexpr int64_t kDefaultMaxRequestCost = int64_t{1} << 17;

// 400 "request_too_costly" (param "max_tokens") naming the product and the cap
// when request_cost(sampling) > max_cost; max_cost <= 0 disables the check.
std::optional<ApiError> check_request_cost(const engine::SamplingParams& sampling, int64_t max_cost);

// The same cap on scoring a prompt (sampling.prompt_logprobs): prompt_tokens x (1 + prompt_logprobs)
// token-units, each a vocabulary-sized row reduced on the host and an entry of the response. 400
// "request_too_costly" naming `param` (the field that asked for the scoring: prompt_logprobs or echo)
// when over; nothing to check without prompt_logprobs.
std::optional<ApiError> check_prompt_scoring_cost(const engine::SamplingParams& sampling, int64_t prompt_tokens,
                                                  int64_t max_cost, const std::string& param);

}  // namespace pagoda::server
