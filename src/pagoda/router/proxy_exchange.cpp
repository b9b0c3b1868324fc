#include "pagoda/router/proxy_exchange.h"

namespace pagoda::router {

ProxyExchange::ProxyExchange(ConnectionPool& pool, std::chrono::milliseconds pool_wait, httplib::Request request,
                             std::chrono::milliseconds read_timeout, size_t max_buffered_bytes,
                             std::function<void()> on_change)
    : state_(std::make_shared<State>()), pool_(&pool) {
  state_->max_buffered = std::max<size_t>(max_buffered_bytes, 1);
  state_->on_change = std::move(on_change);
  thread_ = std::thread(pump, state_, pool_, pool_wait, std::move(request), read_timeout);
}

ProxyExchange::~ProxyExchange() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

void ProxyExchange::pump(std::shared_ptr<State> state, ConnectionPool* pool, std::chrono::milliseconds pool_wait,
                         httplib::Request request, std::chrono::milliseconds read_timeout) {
  const auto notify = [&state] {
    if (state->on_change) state->on_change();
  };
  std::optional<ConnectionPool::Lease> lease = pool->acquire(pool_wait, &state->abandoned);
  if (!lease) {
    {
      std::lock_guard lock(state->mutex);
      state->head.received = false;
      state->head.pool_exhausted = !state->cancelled;
      state->head.error = state->cancelled ? httplib::Error::Canceled : httplib::Error::Success;
      state->head_ready = true;
      state->finished = true;
      state->changed.notify_all();
    }
    return notify();
  }
  httplib::Client& client = lease->client();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(read_timeout).count();
  client.set_read_timeout(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
  request.response_handler = [&state, &notify](const httplib::Response& r) {
    bool go_on;
    {
      std::lock_guard lock(state->mutex);
      state->head.received = true;
      state->head.status = r.status;
      state->head.headers = r.headers;
      state->head_ready = true;
      state->changed.notify_all();
      go_on = !state->cancelled;
    }
    notify();
    return go_on;
  };
  request.content_receiver = [&state, &notify](const char* data, size_t size, uint64_t, uint64_t) {
    {
      std::unique_lock lock(state->mutex);
      state->space.wait(lock, [&] { return state->buffered < state->max_buffered || state->cancelled; });
      if (state->cancelled) return false;
      state->chunks.emplace_back(data, size);
      state->buffered += size;
      state->changed.notify_all();
    }
    notify();
    return true;
  };
  bool cancelled_first;
  {
    std::lock_guard lock(state->mutex);
    cancelled_first = state->cancelled;
    if (!cancelled_first) state->client = &client;
  }
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool ok = !cancelled_first && client.send(request, response, error);
  {
    std::lock_guard lock(state->mutex);
    if (!state->head_ready) {
      // No response handler call: a failure before any response, or a response
      // without a body (204), whose head is in `response`.
      state->head.received = ok;
      if (ok) {
        state->head.status = response.status;
        state->head.headers = response.headers;
      } else {
        state->head.error = cancelled_first ? httplib::Error::Canceled : error;
      }
      state->head_ready = true;
    }
    state->ok = ok && !state->cancelled;
    state->finished = true;
    state->client = nullptr;
    if (!state->ok) lease->discard();
    state->changed.notify_all();
  }
  lease.reset();  // back to the pool (or closed) before anyone hears the exchange ended
  notify();
}

std::optional<ProxyExchange::Head> ProxyExchange::head(std::chrono::milliseconds wait) {
  std::unique_lock lock(state_->mutex);
  if (!state_->changed.wait_for(lock, wait, [&] { return state_->head_ready; })) return std::nullopt;
  return state_->head;
}

ProxyExchange::Next ProxyExchange::next_chunk(std::string* out, std::chrono::milliseconds wait) {
  std::unique_lock lock(state_->mutex);
  state_->changed.wait_for(lock, wait,
                           [&] { return !state_->chunks.empty() || state_->finished || state_->cancelled; });
  if (!state_->chunks.empty()) {
    out->clear();
    for (std::string& chunk : state_->chunks) out->append(chunk);
    state_->chunks.clear();
    state_->buffered = 0;
    state_->space.notify_all();
    return Next::kData;
  }
  if (state_->finished) return state_->ok ? Next::kEnd : Next::kBroken;
  if (state_->cancelled) return Next::kBroken;
  return Next::kPending;
}

void ProxyExchange::cancel() {
  {
    std::lock_guard lock(state_->mutex);
    if (state_->finished || state_->cancelled) return;
    state_->cancelled = true;
    state_->abandoned = true;
    // Shuts the socket down under a running send, which then fails at once.
    if (state_->client != nullptr) state_->client->stop();
    state_->changed.notify_all();
    state_->space.notify_all();
  }
  pool_->wake_waiters();
}

}  // namespace pagoda::router
