#pragma once
// The HTTP/1.1 front: an event-driven server (Boost.Asio for sockets and
// timers, Boost.Beast's parser through HttpRequestReader) that holds many
// connections on few threads and cannot be starved by slow or hostile
// clients. Routes are plain functions from HttpRequest to HttpReply.
//
// Guarantees (each has a test in tests/server/http_front_test.cpp or
// tests/e2e/server_security_e2e_test.cpp):
//  - Deadlines for the whole request head (header_timeout, from the
//    connection's start or the request's first byte) and the whole body
//    (body_timeout): trickling bytes does not extend them.
//  - A body limit for every transfer encoding; a Content-Length over it, or a
//    malformed one, is answered (413 / 400) as soon as the header is read.
//  - The listen backlog is the kernel's somaxconn (bursts are queued by the
//    kernel, not reset). Open connections are capped (max_connections: past
//    it a new connection gets 503 and is closed); handler work waits in a
//    bounded queue (past it, 429 + Retry-After at once).
//  - Idle keep-alive connections stay open keep_alive_timeout (long enough
//    for clients that pool connections); pipelined requests are answered in
//    order.
//  - A client that leaves while its reply is pending is noticed from its
//    socket (end of stream or error while the front keeps reading it), and
//    the reply's ReplySource is cancelled; a client that stops reading a
//    stream is dropped after write_timeout or max_unsent_bytes.
//  - stop(grace): no new connections; connections without a request in
//    progress close now; replies in progress may finish within `grace`, then
//    every connection is closed and serve() returns.
//  - No Range handling: routes answer whole bodies only.
//
// Threads: serve() runs the event loop on the calling thread and io_threads - 1
// more; handlers registered kOnWorker run on worker_threads threads. A handler
// may block (tokenizing, submitting); the loop never does.
//
// Thread safety: route() before bind(); stop() and counters() from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "pagoda/core/status.h"
#include "pagoda/server/http_message.h"
#include "pagoda/server/http_request_reader.h"

namespace pagoda::server {

struct HttpFrontConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                // 0: any free port
  int io_threads = 1;             // event-loop threads, >= 1
  int worker_threads = 2;         // handler threads, >= 1
  int max_queued_handlers = 256;  // handler jobs waiting for a worker; past it 429
  int max_connections = 0;        // 0: from the process's open-file limit
  int listen_backlog = 0;         // 0: /proc/sys/net/core/somaxconn
  HttpReadLimits limits;
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};
  std::chrono::milliseconds keep_alive_timeout{75'000};
  std::chrono::milliseconds write_timeout{30'000};
  size_t max_unsent_bytes = 4u << 20;  // per connection, of a streamed reply
  int retry_after_seconds = 1;
};

struct HttpFrontCounters {
  int64_t connections_accepted = 0;
  int64_t connections_refused = 0;  // over max_connections
  int64_t connections_open = 0;     // gauge
  int64_t header_timeouts = 0;
  int64_t body_timeouts = 0;
  int64_t idle_closes = 0;          // keep-alive connections closed after keep_alive_timeout
  int64_t malformed_requests = 0;   // answered 4xx/5xx by the reader's verdict
  int64_t busy_refusals = 0;        // 429: the handler queue was full
  int64_t slow_readers_dropped = 0; // write timeout or too many unsent bytes
  int64_t client_disconnects = 0;   // replies cancelled because the client left
  std::map<int, int64_t> responses_by_status;
};

enum class RouteRuns { kOnLoop, kOnWorker };  // kOnLoop: cheap, never blocks (e.g. /health)
using RouteHandler = std::function<HttpReply(HttpRequest& request)>;

class HttpFront {
 public:
  explicit HttpFront(HttpFrontConfig config);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Exact path match. A known path with another method is 405, an unknown
  // path 404 (both with the OpenAI error object).
  void route(std::string method, std::string path, RouteRuns where, RouteHandler handler);
  // Every path that starts with `prefix` and has no exact route (a proxy's
  // catch-all); the longest matching prefix wins. 405/404 as for route().
  void route_prefix(std::string method, std::string prefix, RouteRuns where, RouteHandler handler);

  // Binds and listens; returns the port (useful with port 0).
  StatusOr<int> bind();
  // Serves until stop() has closed every connection; returns ok after stop().
  Status serve();
  // See the header comment. Idempotent; safe before serve() and from any thread.
  void stop(std::chrono::milliseconds grace);
  bool stopping() const;

  HttpFrontCounters counters() const;

  class Impl;  // http_front.cpp (its connections hold it too)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace pagoda::server
