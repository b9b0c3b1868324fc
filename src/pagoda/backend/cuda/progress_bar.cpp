#include "pagoda/backend/cuda/progress_bar.h"

#include <algorithm>
#include <cstdio>

namespace pagoda::cuda {

ProgressBar::ProgressBar(std::string label, size_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(total_bytes), enabled_(enabled) {}

void ProgressBar::advance(size_t bytes) {
  done_ = std::min(total_, done_ + bytes);
  draw();
}

void ProgressBar::finish() {
  if (finished_) return;
  done_ = total_;
  draw();
  if (enabled_) std::fputc('\n', stderr);
  finished_ = true;
}

void ProgressBar::draw() {
  if (!enabled_) return;
  const int percent = total_ == 0 ? 100 : static_cast<int>(100.0 * static_cast<double>(done_) / total_);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::fprintf(stderr, "\r%s [%s] %3d%% %7.2f / %.2f GiB", label_.c_str(), bar.c_str(), percent, done_ / kGiB,
               total_ / kGiB);
  std::fflush(stderr);
}

}  // namespace pagoda::cuda
