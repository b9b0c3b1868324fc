#pragma once
// The time source of the KV cache manager (last access stamps for eviction),
// behind an interface so tests and the trace simulator inject their own.
//
// Thread safety: SteadyClock is safe from any thread; ManualClock is not.

#include <chrono>
#include <cstdint>

namespace pagoda::kv {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds; only differences and order matter.
  virtual uint64_t now_ns() const = 0;
};

class SteadyClock final : public Clock {
 public:
  uint64_t now_ns() const override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  // One shared instance for managers built without a clock.
  static const SteadyClock& instance() {
    static const SteadyClock clock;
    return clock;
  }
};

// A clock that moves only when told to: deterministic tests and trace replays.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(uint64_t start_ns = 1) : now_(start_ns) {}
  uint64_t now_ns() const override { return now_; }
  void advance(uint64_t delta_ns) { now_ += delta_ns; }
  void set(uint64_t now_ns) { now_ = now_ns; }

 private:
  uint64_t now_;
};

}  // namespace pagoda::kv
