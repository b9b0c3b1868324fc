#pragma once
// Parses one HTTP/1.x request from bytes as they arrive, with limits, and no
// I/O: the front feeds what it reads; tests and the fuzzer feed anything.
//
//   HttpRequestReader reader(limits);
//   size_t used = reader.feed(bytes);     // may use fewer bytes than given
//   if (reader.failed())   ... answer reader.error() and close
//   if (reader.header_done() && reader.expects_continue()) ... send "100 Continue"
//   if (reader.complete()) ... HttpRequest r = reader.take_request();
//
// The parser is Boost.Beast's (strict RFC 7230: a bad or repeated
// Content-Length, a bad chunk, obsolete line folding in the wrong place and
// the like are errors at once). Limits: the request line plus headers, and the
// body whatever its transfer encoding (a Content-Length over the limit fails
// as soon as the header is read; a chunked body as soon as it grows past it).
// Bytes after a complete request (a pipelined next one) are left unused.
//
// Thread safety: none; one reader per request.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "pagoda/server/http_message.h"

namespace pagoda::server {

struct HttpReadLimits {
  size_t max_header_bytes = 32u << 10;
  size_t max_body_bytes = 8u << 20;
};

// Why a request could not be read: the status to answer (400 malformed,
// 413 body too large, 431 header too large, 501 unknown transfer coding,
// 505 version) and words for the error body.
struct HttpReadError {
  int http_status = 400;
  std::string message;
};

class HttpRequestReader {
 public:
  explicit HttpRequestReader(HttpReadLimits limits);
  ~HttpRequestReader();
  HttpRequestReader(const HttpRequestReader&) = delete;
  HttpRequestReader& operator=(const HttpRequestReader&) = delete;

  // Parses as much of `bytes` as it can; returns how many it used. Call again
  // with the unused rest plus new bytes. No-op once complete or failed.
  size_t feed(std::string_view bytes);

  bool header_done() const;
  bool complete() const;
  bool failed() const { return error_.has_value(); }
  const std::optional<HttpReadError>& error() const { return error_; }
  // After header_done(): the client waits for "100 Continue" before the body.
  bool expects_continue() const;
  // After header_done(): the connection may stay open after the answer.
  bool keep_alive() const;
  // After complete(): the request (moves the body out). Once.
  HttpRequest take_request();

 private:
  class Parser;
  std::unique_ptr<Parser> parser_;
  std::optional<HttpReadError> error_;
};

}  // namespace pagoda::server
