#include "pagoda/server/first_token_floor.h"

namespace pagoda::server {

WakeTimer::WakeTimer() : thread_([this] { run(); }) {}

WakeTimer::~WakeTimer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void WakeTimer::wake_at(std::chrono::steady_clock::time_point when, std::function<void()> wake) {
  bool earliest = false;
  {
    std::lock_guard lock(mutex_);
    earliest = queue_.empty() || when < queue_.top().when;
    queue_.push(Due{when, next_order_++, std::move(wake)});
  }
  if (earliest) changed_.notify_all();
}

size_t WakeTimer::pending() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

void WakeTimer::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (queue_.empty()) {
      changed_.wait(lock);
      continue;
    }
    const auto when = queue_.top().when;
    if (std::chrono::steady_clock::now() < when) {
      changed_.wait_until(lock, when);
      continue;
    }
    std::function<void()> wake = std::move(const_cast<Due&>(queue_.top()).wake);
    queue_.pop();
    lock.unlock();
    wake();  // outside the lock: a wake may schedule another
    lock.lock();
  }
}

}  // namespace pagoda::server
