#pragma once
// ProxyExchange: one HTTP request to a backend, run on a thread of its own,
// whose response is handed over as it arrives: first the status and headers
// (wait_head), then the body in chunks (next_chunk) through a bounded buffer,
// so the backend is read no faster than the client takes the bytes. Bytes are
// passed on exactly as received (no decompression, no re-framing of SSE).
//
// cancel() (the client left, or the router gave up on this backend) closes
// the backend connection; a `pagoda serve` backend notices and aborts the
// generation, freeing its KV blocks. The connection goes back to its pool
// only after a complete, uncancelled exchange.
//
// Thread safety: wait_head, next_chunk and cancel may be called from any one
// thread at a time (the router's handler and then its content provider); the
// destructor cancels an unfinished exchange and joins the thread.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <httplib.h>

#include "pagoda/router/connection_pool.h"

namespace pagoda::router {

class ProxyExchange {
 public:
  struct Head {
    bool received = false;  // false: no response at all (see error)
    int status = 0;
    httplib::Headers headers;
    httplib::Error error = httplib::Error::Success;  // when !received
  };
  enum class Next { kData, kEnd, kBroken, kPending };

  // Starts `request` (method, target in path, headers, body) on the lease's
  // connection. read_timeout bounds every wait for backend bytes.
  ProxyExchange(ConnectionPool::Lease lease, httplib::Request request, std::chrono::milliseconds read_timeout,
                size_t max_buffered_bytes);
  ~ProxyExchange();
  ProxyExchange(const ProxyExchange&) = delete;
  ProxyExchange& operator=(const ProxyExchange&) = delete;

  // The head once it is known (received, or the exchange failed before any
  // response); nullopt if still waiting after `wait`.
  std::optional<Head> wait_head(std::chrono::milliseconds wait);
  // kData: *out holds the next chunk; kEnd: the body is complete; kBroken: the
  // backend failed mid-body or the exchange was cancelled; kPending: nothing
  // within `wait`.
  Next next_chunk(std::string* out, std::chrono::milliseconds wait);
  void cancel();

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;  // head, chunk, finish, cancel
    std::condition_variable space;    // the buffer drained
    size_t max_buffered = 0;
    size_t buffered = 0;
    std::deque<std::string> chunks;
    bool head_ready = false;
    Head head;
    bool finished = false;
    bool ok = false;
    bool cancelled = false;
    httplib::Client* client = nullptr;  // while the send runs
  };
  static void pump(std::shared_ptr<State> state, ConnectionPool::Lease lease, httplib::Request request,
                   std::chrono::milliseconds read_timeout);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace pagoda::router
