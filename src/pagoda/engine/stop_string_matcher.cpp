#include "pagoda/engine/stop_string_matcher.h"

#include <algorithm>
#include <utility>

namespace pagoda::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings, bool include_stop)
    : stop_strings_(std::move(stop_strings)), include_stop_(include_stop) {}

std::string StopStringMatcher::append(std::string_view text) {
  if (stopped_) return {};
  if (stop_strings_.empty()) return std::string(text);
  std::string buffer = std::move(held_);
  held_.clear();
  buffer.append(text);

  size_t earliest = std::string::npos, end = 0;
  for (const auto& stop : stop_strings_) {
    const size_t at = buffer.find(stop);
    if (at < earliest) {
      earliest = at;
      end = at + stop.size();
    }
  }
  if (earliest != std::string::npos) {
    stopped_ = true;
    buffer.resize(include_stop_ ? end : earliest);
    return buffer;
  }
  return hold_back(std::move(buffer));
}

std::string StopStringMatcher::hold_back(std::string buffer) {
  size_t hold = 0;
  for (const auto& stop : stop_strings_) {
    const size_t max_len = std::min(stop.size() - 1, buffer.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(buffer).substr(buffer.size() - len) == std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  held_ = buffer.substr(buffer.size() - hold);
  buffer.resize(buffer.size() - hold);
  return buffer;
}

std::string StopStringMatcher::pass(std::string_view text) {
  if (stopped_) return {};
  std::string buffer = std::exchange(held_, {});
  buffer.append(text);
  return hold_back(std::move(buffer));
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace pagoda::engine
