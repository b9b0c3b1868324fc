#include "pagoda/server/request_limits.h"

#include <algorithm>
#include <cctype>
#include <string>

#include <fmt/format.h>

namespace pagoda::server {

std::optional<ApiError> check_json_content_type(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  constexpr std::string_view kJson = "application/json";
  bool is_json = type.size() == kJson.size();
  for (size_t i = 0; is_json && i < kJson.size(); ++i)
    is_json = std::tolower(static_cast<unsigned char>(type[i])) == kJson[i];
  if (is_json) return std::nullopt;
  ApiError e;
  e.http_status = 415;
  e.code = "unsupported_media_type";
  e.message = content_type.empty() ? "send the body as JSON with 'Content-Type: application/json'"
                                   : fmt::format("Content-Type '{}' is not accepted: send the body as JSON with "
                                                 "'Content-Type: application/json'",
                                                 content_type.substr(0, 128));
  return e;
}

int64_t request_cost(const engine::SamplingParams& sampling) {
  const int64_t per_token = 1 + static_cast<int64_t>(sampling.logprobs.value_or(0));
  return static_cast<int64_t>(std::max(sampling.n, 1)) * std::max<int64_t>(sampling.max_tokens, 1) * per_token;
}

std::optional<ApiError> check_request_cost(const engine::SamplingParams& sampling, int64_t max_cost) {
  if (max_cost <= 0) return std::nullopt;
  const int64_t cost = request_cost(sampling);
  if (cost <= max_cost) return std::nullopt;
  return invalid_request(
      fmt::format("this request may generate n ({}) x max_tokens ({}) x (1 + logprobs ({})) = {} token-units, over "
                  "this server's limit of {} per request; lower n, max_tokens or logprobs",
                  sampling.n, sampling.max_tokens, sampling.logprobs.value_or(0), cost, max_cost),
      "max_tokens", "request_too_costly");
}

std::optional<ApiError> check_prompt_scoring_cost(const engine::SamplingParams& sampling, int64_t prompt_tokens,
                                                  int64_t max_cost, const std::string& param) {
  if (max_cost <= 0 || !sampling.prompt_logprobs) return std::nullopt;
  const int64_t cost = prompt_tokens * (1 + *sampling.prompt_logprobs);
  if (cost <= max_cost) return std::nullopt;
  return invalid_request(fmt::format("scoring the prompt ({}) costs its {} tokens x (1 + {} alternatives) = {} "
                                     "token-units, over this server's limit of {} per request; shorten the prompt "
                                     "or ask for fewer alternatives",
                                     param, prompt_tokens, *sampling.prompt_logprobs, cost, max_cost),
                         param, "request_too_costly");
}

}  // namespace pagoda::server
