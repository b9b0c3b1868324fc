#pragma once
// ConnectionPool: at most `max_connections` HTTP/1.1 connections from the
// router to one backend, kept alive between requests.
//
// acquire() lends one connection (an httplib::Client, which holds at most one
// socket) exclusively until the Lease is destroyed: then it goes back to the
// idle list for the next request, or, after discard() (the exchange failed or
// was cut off, so the socket's state is unknown), it is closed and its slot
// freed. A request that finds every connection lent waits up to the given
// time: the pool bounds both the sockets and the concurrency towards one
// backend. A connection the backend closed while idle is noticed by httplib
// before reuse and reconnected.
//
// Thread safety: acquire() and the counters from any thread; one Lease is used
// by one thread at a time. The pool must outlive its leases.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace httplib {
class Client;
enum class Error;
}

namespace pagoda::router {

class ConnectionPool {
 public:
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    httplib::Client& client() { return *client_; }
    // Closes the connection instead of returning it (its state is unknown).
    void discard() { discard_ = true; }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, std::unique_ptr<httplib::Client> client);
    ConnectionPool* pool_;
    std::unique_ptr<httplib::Client> client_;
    bool discard_ = false;
  };

  ConnectionPool(std::string host, int port, int max_connections, std::chrono::milliseconds connect_timeout);
  ~ConnectionPool();

  // nullopt when every connection stayed lent for `wait`, or, with
  // `abandoned` given, as soon as it reads true after a wake_waiters().
  std::optional<Lease> acquire(std::chrono::milliseconds wait, const std::atomic<bool>* abandoned = nullptr);
  // Makes every waiting acquire() look at its `abandoned` flag again.
  void wake_waiters();

  int max_connections() const { return max_connections_; }
  int lent() const;
  int idle() const;

 private:
  void give_back(std::unique_ptr<httplib::Client> client, bool discard);
  std::unique_ptr<httplib::Client> new_client() const;

  const std::string host_;
  const int port_;
  const int max_connections_;
  const std::chrono::milliseconds connect_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<httplib::Client>> idle_;
  int lent_ = 0;
};

// A client failure in words ("connection refused or unreachable", "read
// failed or timed out", ...), for logs and error messages.
std::string describe_http_error(httplib::Error error);

}  // namespace pagoda::router
