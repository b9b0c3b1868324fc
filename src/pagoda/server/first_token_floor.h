#pragma once
// A floor under time to first token, so a prefix-cache hit cannot be told
// from a miss by its timing (docs/SECURITY.md, "Isolation inside a tenant").
//
// `pagoda serve --cache-hit-ttft-floor-ms F`: a generation reply holds back
// its first token (streamed) or its whole answer (not streamed) until F after
// the request arrived. Scope:
//  - all requests (the default): hit or miss, nothing is sent before F, so
//    every prompt whose miss takes at most F looks the same hit or miss;
//  - hits only: only requests whose prompt hit the prefix cache wait. Cheaper,
//    but a hit on a prompt whose miss is quicker than F now comes *later* than
//    its miss, which is a signal of its own; the KS benchmark shows both.
// The streamed head (200, text/event-stream) is not held: it leaves before the
// engine has looked at the prompt and says nothing about the cache.
//
// WakeTimer runs the replies' wake callbacks at their release times, on one
// thread, so no thread sleeps per request.
//
// Thread safety: WakeTimer::wake_at from any thread; FirstTokenFloor is a value.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace pagoda::server {

class WakeTimer {
 public:
  WakeTimer();
  ~WakeTimer();  // callbacks not yet due are dropped
  WakeTimer(const WakeTimer&) = delete;
  WakeTimer& operator=(const WakeTimer&) = delete;

  // Calls `wake` on the timer's thread at (or just after) `when`. `wake` must
  // be cheap and safe to call late (ReplySource wakes are).
  void wake_at(std::chrono::steady_clock::time_point when, std::function<void()> wake);
  size_t pending() const;

 private:
  struct Due {
    std::chrono::steady_clock::time_point when;
    uint64_t order;
    std::function<void()> wake;
    bool operator>(const Due& o) const { return when != o.when ? when > o.when : order > o.order; }
  };
  void run();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> queue_;
  uint64_t next_order_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

// One request's floor; inactive (timer null) when the server has none.
struct FirstTokenFloor {
  WakeTimer* timer = nullptr;
  std::chrono::steady_clock::time_point not_before{};
  bool hits_only = false;
  bool active() const { return timer != nullptr; }
};

}  // namespace pagoda::server
