// The HTTP front's request parsing (server/http_request_reader.h): any bytes,
// fed in pieces whose sizes come from the input, as pipelined requests; each
// parsed request must respect the limits.

#include <string>

#include "fuzz_target.h"
#include "pagoda/server/http_request_reader.h"

namespace pagoda::fuzz {

int fuzz_http_request(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  server::HttpReadLimits limits;
  limits.max_header_bytes = 2048;
  limits.max_body_bytes = 4096;
  const size_t piece = 1 + data[0] % 64;  // bytes per read
  std::string_view input = as_text(data + 1, size - 1);
  std::string buffer;
  for (int requests = 0; requests < 16; ++requests) {
    server::HttpRequestReader reader(limits);
    while (!reader.complete() && !reader.failed()) {
      if (buffer.empty() && input.empty()) return 0;  // the peer stopped sending
      const size_t take = std::min(piece, input.size());
      buffer.append(input.substr(0, take));
      input.remove_prefix(take);
      const size_t used = reader.feed(buffer);
      if (used > buffer.size()) fail("used more bytes than given");
      buffer.erase(0, used);
      if (used == 0 && take == 0 && !reader.complete() && !reader.failed()) return 0;
    }
    if (reader.failed()) {
      const int status = reader.error()->http_status;
      if (status < 400 || status > 599) fail("a read error that is not 4xx/5xx");
      return 0;
    }
    server::HttpRequest r = reader.take_request();
    if (r.body.size() > limits.max_body_bytes) fail("a body over the limit");
    if (r.path.empty() || r.path[0] != '/') fail("a path that does not start with '/'");
    if (r.version != 10 && r.version != 11) fail("an HTTP version other than 1.0 / 1.1");
  }
  return 0;
}

}  // namespace pagoda::fuzz

PAGODA_FUZZ_TARGET(fuzz_http_request)
