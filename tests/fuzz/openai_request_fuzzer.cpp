// The OpenAI request parser (server/openai_request.h): any bytes as a body of
// /v1/completions, /v1/chat/completions or /v1/cache/drop. The first byte
// picks the endpoint.

#include <variant>

#include "fuzz_target.h"
#include "pagoda/server/openai_request.h"

namespace pagoda::fuzz {

int fuzz_openai_request(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body = as_text(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
    case 1: {
      auto parsed = server::parse_openai_request(
          body, data[0] % 3 == 0 ? server::Endpoint::kCompletions : server::Endpoint::kChatCompletions);
      if (auto* e = std::get_if<server::ApiError>(&parsed)) {
        if (e->http_status < 400 || e->http_status > 599) fail("an error that is not 4xx/5xx");
        if (e->body().size() > 4096) fail("an unbounded error body");
      } else {
        const auto& r = std::get<server::OpenAiRequest>(parsed);
        if (r.sampling.n < 1 || r.sampling.n > 16) fail("n outside its range");
        if (r.sampling.max_tokens < 0) fail("negative max_tokens");
      }
      break;
    }
    default: {
      auto parsed = server::parse_cache_drop_request(body);
      if (auto* e = std::get_if<server::ApiError>(&parsed); e && e->body().size() > 4096) fail("an unbounded error body");
    }
  }
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_openai_request)
