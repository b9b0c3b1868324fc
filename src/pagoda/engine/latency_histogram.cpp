#include "pagoda/engine/latency_histogram.h"

#include <algorithm>

namespace pagoda::engine {

LatencyHistogram::LatencyHistogram(std::vector<double> upper_bounds_s)
    : bounds_(std::move(upper_bounds_s)), bucket_counts_(bounds_.size() + 1, 0) {}

std::vector<double> LatencyHistogram::default_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
          0.75,  1.0,    1.5,   2.0,  3.0,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
}

void LatencyHistogram::observe(double seconds) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin();
  ++bucket_counts_[bucket];
  ++count_;
  sum_ += seconds;
}

std::vector<uint64_t> LatencyHistogram::cumulative_counts() const {
  std::vector<uint64_t> out(bucket_counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < bucket_counts_.size(); ++i) out[i] = running += bucket_counts_[i];
  return out;
}

double LatencyHistogram::quantile(double q) const {
  if (count_ == 0) return 0.0;
  const double target = q * static_cast<double>(count_);
  uint64_t running = 0;
  for (size_t i = 0; i < bucket_counts_.size(); ++i) {
    if (bucket_counts_[i] == 0) continue;
    if (static_cast<double>(running + bucket_counts_[i]) >= target) {
      const double lo = i == 0 ? 0.0 : bounds_[i - 1];
      const double hi = i < bounds_.size() ? bounds_[i] : bounds_.back();
      const double frac = (target - static_cast<double>(running)) / static_cast<double>(bucket_counts_[i]);
      return lo + (hi - lo) * std::clamp(frac, 0.0, 1.0);
    }
    running += bucket_counts_[i];
  }
  return bounds_.empty() ? 0.0 : bounds_.back();
}

}  // namespace pagoda::engine
