#include "pagoda/router/connection_pool.h"

#include <httplib.h>

namespace pagoda::router {

ConnectionPool::Lease::Lease(ConnectionPool* pool, std::unique_ptr<httplib::Client> client)
    : pool_(pool), client_(std::move(client)) {}

ConnectionPool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), client_(std::move(other.client_)), discard_(other.discard_) {
  other.pool_ = nullptr;
}

ConnectionPool::Lease::~Lease() {
  if (pool_ != nullptr && client_) pool_->give_back(std::move(client_), discard_);
}

ConnectionPool::ConnectionPool(std::string host, int port, int max_connections,
                               std::chrono::milliseconds connect_timeout)
    : host_(std::move(host)),
      port_(port),
      max_connections_(std::max(1, max_connections)),
      connect_timeout_(connect_timeout) {}

ConnectionPool::~ConnectionPool() = default;

std::unique_ptr<httplib::Client> ConnectionPool::new_client() const {
  auto client = std::make_unique<httplib::Client>(host_, port_);
  client->set_keep_alive(true);
  // Bodies pass through as the backend wrote them; the router never re-encodes.
  client->set_decompress(false);
  client->set_url_encode(false);  // request targets are forwarded as the client wrote them
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(connect_timeout_).count();
  client->set_connection_timeout(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
  return client;
}

std::optional<ConnectionPool::Lease> ConnectionPool::acquire(std::chrono::milliseconds wait,
                                                            const std::atomic<bool>* abandoned) {
  const auto given_up = [abandoned] { return abandoned != nullptr && abandoned->load(); };
  std::unique_lock lock(mutex_);
  if (!returned_.wait_for(lock, wait, [&] { return given_up() || !idle_.empty() || lent_ < max_connections_; }) ||
      given_up())
    return std::nullopt;
  ++lent_;
  if (!idle_.empty()) {
    std::unique_ptr<httplib::Client> client = std::move(idle_.back());
    idle_.pop_back();
    return Lease(this, std::move(client));
  }
  lock.unlock();
  return Lease(this, new_client());
}

void ConnectionPool::wake_waiters() {
  { std::lock_guard lock(mutex_); }  // a waiter between its check and its wait sees the flag or the notify
  returned_.notify_all();
}

void ConnectionPool::give_back(std::unique_ptr<httplib::Client> client, bool discard) {
  {
    std::lock_guard lock(mutex_);
    --lent_;
    if (!discard) idle_.push_back(std::move(client));
  }
  returned_.notify_one();
  // A discarded client closes its socket here, outside the lock.
}

int ConnectionPool::lent() const {
  std::lock_guard lock(mutex_);
  return lent_;
}

std::string describe_http_error(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "connection refused or unreachable";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    case httplib::Error::Read: return "read failed or timed out";
    case httplib::Error::Write: return "write failed";
    case httplib::Error::Canceled: return "cancelled";
    default: return httplib::to_string(error);
  }
}

int ConnectionPool::idle() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(idle_.size());
}

}  // namespace pagoda::router
