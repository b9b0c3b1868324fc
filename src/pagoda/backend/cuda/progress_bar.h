#pragma once
// A one-line progress bar on stderr ("\r" redraws), e.g. for weight loading:
//   loading weights [##########..........]  52%   8.31 / 16.06 GiB
// Redraws at most once per percent so logs stay short.
//
// Thread safety: one thread.

#include <cstddef>
#include <string>

namespace pagoda::cuda {

class ProgressBar {
 public:
  ProgressBar(std::string label, size_t total_bytes, bool enabled = true);
  void advance(size_t bytes);
  void finish();  // draws 100% and ends the line

 private:
  void draw();
  std::string label_;
  size_t total_ = 0;
  size_t done_ = 0;
  int last_percent_ = -1;
  bool enabled_ = true;
  bool finished_ = false;
};

}  // namespace pagoda::cuda
