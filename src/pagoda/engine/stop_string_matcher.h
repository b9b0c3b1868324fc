#pragma once
// Finds stop strings in streamed text even when one spans several tokens, and
// never lets a client see the start of a stop string that later completes:
// the longest suffix that could still grow into a stop string is held back
// until it either completes (dropped, generation stops) or diverges (emitted).
//
// Thread safety: one instance per sequence, used by the engine thread only.

#include <string>
#include <string_view>
#include <vector>

namespace pagoda::engine {

class StopStringMatcher {
 public:
  // include_stop: the text ends with the stop string that matched (vLLM's
  // include_stop_str_in_output) instead of just before it.
  explicit StopStringMatcher(std::vector<std::string> stop_strings = {}, bool include_stop = false);

  // Feeds newly decoded text; returns the text that is now safe to emit. Once a
  // stop string completes, stopped() is true and the returned text ends just
  // before it (the stop string itself is emitted only with include_stop; of
  // stop strings found at the same place, the first given).
  std::string append(std::string_view text);
  // Feeds text that must not end the output (min_tokens): matches nothing, but
  // still holds back an end that could start a stop string (the next append
  // may complete it, as vLLM looks back over the stop's length).
  std::string pass(std::string_view text);
  // Releases whatever is held back (call when generation ends for another reason).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  // Keeps the longest end of `buffer` that is a proper prefix of a stop string in held_; returns the rest.
  std::string hold_back(std::string buffer);

  std::vector<std::string> stop_strings_;
  std::string held_;
  bool include_stop_ = false;
  bool stopped_ = false;
};

}  // namespace pagoda::engine
