#pragma once
// The HTTP front's plain types, free of any networking library: what a route
// handler receives (HttpRequest) and what it answers (HttpReply: a whole
// response now, or a ReplySource that produces it later, piece by piece).
//
// Thread safety: values. A ReplySource is driven by one connection: start(),
// pull() and cancel() are never called concurrently for one source; wake()
// (the callback start() receives) may be called from any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagoda::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// Value of the first header named `name` (ASCII case-insensitive), or "".
std::string_view find_header(const HttpHeaders& headers, std::string_view name);

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: "/v1/completions?x=1"
  std::string path;    // target up to '?'
  HttpHeaders headers;
  std::string body;    // whole, de-chunked; at most the front's body limit
  unsigned version = 11;  // 10: HTTP/1.0, 11: HTTP/1.1
  std::string remote_address;
  int remote_port = 0;

  std::string_view header(std::string_view name) const { return find_header(headers, name); }
  bool has_header(std::string_view name) const;
  // The first query parameter `name` of the target ("?since=3&x=y"), percent-
  // and '+'-decoded; nullopt when absent.
  std::optional<std::string> query_param(std::string_view name) const;
};

// A complete response. Content-Length, Connection and Date are the front's.
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HttpHeaders headers;  // extra ones (Retry-After, Cache-Control, ...)
  std::string body;
};

// What a ReplySource has ready. The first piece with `head` set carries the
// status line: with `streamed` false its `body` is the whole body and `done`
// must be true; with `streamed` true the body follows in `data` pieces (sent
// with chunked transfer encoding) until one has `done`.
struct ReplyPiece {
  bool has_head = false;
  HttpResponse head;
  bool streamed = false;
  std::string data;
  bool done = false;
};

class ReplySource {
 public:
  virtual ~ReplySource() = default;
  // Called once, first. `wake` tells the connection to pull() again; it may be
  // called from any thread, any number of times, also after the reply ended.
  virtual void start(std::function<void()> wake) = 0;
  // Whatever is ready (a piece with nothing set: nothing yet). After a piece
  // with `done`, never called again.
  virtual ReplyPiece pull() = 0;
  // The client left, or the server closes the connection before the reply is
  // done: stop the work behind it. Not called after a piece with `done`.
  virtual void cancel() = 0;
};

// A handler's answer: `source` set for a deferred reply, else `response`.
struct HttpReply {
  HttpResponse response;
  std::shared_ptr<ReplySource> source;

  static HttpReply deferred(std::shared_ptr<ReplySource> s) {
    HttpReply r;
    r.source = std::move(s);
    return r;
  }
};

// Standard reason phrase for a status code ("OK", "Too Many Requests", ...).
std::string_view http_reason_phrase(int status);

}  // namespace pagoda::server
