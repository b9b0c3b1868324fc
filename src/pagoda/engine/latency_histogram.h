#pragma once
// A fixed-bucket histogram of durations in seconds, in the shape Prometheus
// expects (cumulative counts per upper bound, sum, count). Used for time to
// first token and inter-token latency.
//
// Thread safety: none; the engine copies it into stats snapshots under a lock.

#include <cstdint>
#include <vector>

namespace pagoda::engine {

class LatencyHistogram {
 public:
  // Upper bounds in seconds, ascending; +Inf is implicit.
  explicit LatencyHistogram(std::vector<double> upper_bounds_s = default_bounds());

  void observe(double seconds);
  const std::vector<double>& upper_bounds() const { return bounds_; }
  // counts()[i]: observations <= upper_bounds()[i] (cumulative); last entry is +Inf.
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  // Approximate quantile (q in [0, 1]) by linear interpolation inside a bucket.
  double quantile(double q) const;

  static std::vector<double> default_bounds();

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> bucket_counts_;  // per bucket, not cumulative; size bounds_ + 1
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

}  // namespace pagoda::engine
