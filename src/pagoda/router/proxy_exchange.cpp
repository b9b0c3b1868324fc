#include "pagoda/router/proxy_exchange.h"

namespace pagoda::router {

ProxyExchange::ProxyExchange(ConnectionPool::Lease lease, httplib::Request request,
                             std::chrono::milliseconds read_timeout, size_t max_buffered_bytes)
    : state_(std::make_shared<State>()) {
  state_->max_buffered = std::max<size_t>(max_buffered_bytes, 1);
  state_->client = &lease.client();
  thread_ = std::thread(pump, state_, std::move(lease), std::move(request), read_timeout);
}

ProxyExchange::~ProxyExchange() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

void ProxyExchange::pump(std::shared_ptr<State> state, ConnectionPool::Lease lease, httplib::Request request,
                         std::chrono::milliseconds read_timeout) {
  httplib::Client& client = lease.client();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(read_timeout).count();
  client.set_read_timeout(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
  request.response_handler = [&state](const httplib::Response& r) {
    std::lock_guard lock(state->mutex);
    state->head.received = true;
    state->head.status = r.status;
    state->head.headers = r.headers;
    state->head_ready = true;
    state->changed.notify_all();
    return !state->cancelled;
  };
  request.content_receiver = [&state](const char* data, size_t size, uint64_t, uint64_t) {
    std::unique_lock lock(state->mutex);
    state->space.wait(lock, [&] { return state->buffered < state->max_buffered || state->cancelled; });
    if (state->cancelled) return false;
    state->chunks.emplace_back(data, size);
    state->buffered += size;
    state->changed.notify_all();
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  bool cancelled_first;
  {
    std::lock_guard lock(state->mutex);
    cancelled_first = state->cancelled;
  }
  const bool ok = !cancelled_first && client.send(request, response, error);
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
  if (!state->ok) lease.discard();
  state->changed.notify_all();
}

std::optional<ProxyExchange::Head> ProxyExchange::wait_head(std::chrono::milliseconds wait) {
  std::unique_lock lock(state_->mutex);
  if (!state_->changed.wait_for(lock, wait, [&] { return state_->head_ready; })) return std::nullopt;
  return state_->head;
}

ProxyExchange::Next ProxyExchange::next_chunk(std::string* out, std::chrono::milliseconds wait) {
  std::unique_lock lock(state_->mutex);
  state_->changed.wait_for(lock, wait,
                           [&] { return !state_->chunks.empty() || state_->finished || state_->cancelled; });
  if (!state_->chunks.empty()) {
    *out = std::move(state_->chunks.front());
    state_->chunks.pop_front();
    state_->buffered -= out->size();
    state_->space.notify_all();
    return Next::kData;
  }
  if (state_->finished) return state_->ok ? Next::kEnd : Next::kBroken;
  if (state_->cancelled) return Next::kBroken;
  return Next::kPending;
}

void ProxyExchange::cancel() {
  std::lock_guard lock(state_->mutex);
  if (state_->finished || state_->cancelled) return;
  state_->cancelled = true;
  // Shuts the socket down under a running send, which then fails at once.
  if (state_->client != nullptr) state_->client->stop();
  state_->changed.notify_all();
  state_->space.notify_all();
}

}  // namespace pagoda::router
