#pragma once
// ProxyExchange: one HTTP request to a backend, run on a thread of its own,
// whose response is handed over as it arrives: first the status and headers
// (head), then the body in chunks (next_chunk) through a bounded buffer, so
// the backend is read no faster than the client takes the bytes. Bytes are
// passed on exactly as received (no decompression, no re-framing of SSE).
//
// The thread first takes a connection from the backend's pool, waiting up to
// `pool_wait` (a head with pool_exhausted when none came free), then sends.
// Every change (head known, bytes arrived, finished) calls `on_change`, from
// the exchange's thread, so an event loop can pull without polling.
//
// cancel() (the client left, or the router gave up on this backend) stops a
// wait for the pool and closes the backend connection; a `pagoda serve`
// backend notices and aborts the generation, freeing its KV blocks. The
// connection goes back to its pool only after a complete, uncancelled
// exchange.
//
// Thread safety: head, next_chunk and cancel may be called from any one
// thread at a time; the destructor cancels an unfinished exchange and joins
// the thread (promptly: a cancelled exchange waits for nothing).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
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
    bool received = false;        // false: no response at all (see error, pool_exhausted)
    bool pool_exhausted = false;  // no pooled connection came free within pool_wait
    int status = 0;
    httplib::Headers headers;
    httplib::Error error = httplib::Error::Success;  // when !received
  };
  enum class Next { kData, kEnd, kBroken, kPending };

  // Starts `request` (method, target in path, headers, body) on a connection
  // of `pool`, which must outlive the exchange. read_timeout bounds every wait
  // for backend bytes. on_change may be empty.
  ProxyExchange(ConnectionPool& pool, std::chrono::milliseconds pool_wait, httplib::Request request,
                std::chrono::milliseconds read_timeout, size_t max_buffered_bytes, std::function<void()> on_change);
  ~ProxyExchange();
  ProxyExchange(const ProxyExchange&) = delete;
  ProxyExchange& operator=(const ProxyExchange&) = delete;

  // The head once it is known (received, or the exchange failed before any
  // response); nullopt if still unknown after `wait`.
  std::optional<Head> head(std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // kData: *out holds every byte buffered now, in order; kEnd: the body is
  // complete; kBroken: the backend failed mid-body or the exchange was
  // cancelled; kPending: nothing within `wait`.
  Next next_chunk(std::string* out, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
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
    std::atomic<bool> abandoned{false};  // cancelled, readable without the mutex (the pool wait)
    httplib::Client* client = nullptr;   // while the send runs
    std::function<void()> on_change;
  };
  static void pump(std::shared_ptr<State> state, ConnectionPool* pool, std::chrono::milliseconds pool_wait,
                   httplib::Request request, std::chrono::milliseconds read_timeout);

  std::shared_ptr<State> state_;
  ConnectionPool* pool_;
  std::thread thread_;
};

}  // namespace pagoda::router
