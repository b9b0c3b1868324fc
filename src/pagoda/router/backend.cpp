#include "pagoda/router/backend.h"

#include <algorithm>

namespace pagoda::router {

Backend::Backend(BackendUrl url, const BackendOptions& options)
    : url_(std::move(url)), pool_(url_.host, url_.port, options.max_connections, options.connect_timeout) {}

std::optional<BackendLoad> Backend::reported_load() const {
  std::lock_guard lock(load_mutex_);
  return load_;
}

void Backend::set_reported_load(std::optional<BackendLoad> load) {
  std::lock_guard lock(load_mutex_);
  load_ = load;
}

uint64_t Backend::begin_prefill(int64_t tokens) {
  tokens = std::max<int64_t>(tokens, 0);
  std::lock_guard lock(prefill_mutex_);
  const uint64_t ticket = next_ticket_++;
  pending_prefills_.emplace(ticket, PendingPrefill{std::chrono::steady_clock::now(), tokens});
  pending_prefill_tokens_ += tokens;
  return ticket;
}

void Backend::end_prefill(uint64_t ticket) {
  std::lock_guard lock(prefill_mutex_);
  const auto it = pending_prefills_.find(ticket);
  if (it == pending_prefills_.end()) return;
  pending_prefill_tokens_ -= it->second.tokens;
  pending_prefills_.erase(it);
}

void Backend::settle_prefills(const BackendLoad& load, std::chrono::steady_clock::time_point asked,
                              std::chrono::milliseconds arrival_allowance) {
  const auto arrived_before = asked - arrival_allowance;
  std::lock_guard lock(prefill_mutex_);
  int64_t arrived = 0;
  for (const auto& [ticket, p] : pending_prefills_) {
    if (p.routed >= arrived_before) break;
    ++arrived;
  }
  int64_t started = arrived - std::max<int64_t>(load.waiting, 0) - std::max<int64_t>(load.queued, 0);
  for (auto it = pending_prefills_.begin(); started > 0 && it != pending_prefills_.end(); --started) {
    pending_prefill_tokens_ -= it->second.tokens;
    ++prefills_settled_;
    it = pending_prefills_.erase(it);
  }
}

}  // namespace pagoda::router
