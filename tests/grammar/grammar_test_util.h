#pragma once
// Test helpers: drive a GrammarMatcher byte by byte without a model.

#include <random>
#include <string>
#include <vector>

#include "pagoda/grammar/grammar_matcher.h"

namespace pagoda::grammar::testing {

// True when the grammar accepts `text` as a whole sentence.
inline bool matches(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher m(grammar);
  return m.accept(text) && m.can_end();
}

// The bytes the matcher's state accepts next.
inline std::vector<uint8_t> allowed_bytes(GrammarMatcher& m) {
  std::vector<uint8_t> out;
  GrammarMatcher::State next;
  const size_t mark = m.mark();
  for (int b = 0; b < 256; ++b) {
    m.advance(m.state(), static_cast<uint8_t>(b), next);
    if (!next.dead()) out.push_back(static_cast<uint8_t>(b));
    m.rollback(mark);
  }
  return out;
}

// A random sentence of the grammar: random allowed bytes, ending with probability `stop` once
// complete and forced to end (or give up) after `max_bytes`. Empty optional when it got stuck.
inline std::optional<std::string> random_sentence(const std::shared_ptr<const Grammar>& grammar, uint64_t seed,
                                                  size_t max_bytes = 4000, double stop = 0.15) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(grammar);
  std::string out;
  while (out.size() < max_bytes) {
    if (m.can_end() && (m.exhausted() || std::uniform_real_distribution<double>(0, 1)(rng) < stop)) return out;
    auto bytes = allowed_bytes(m);
    if (bytes.empty()) return std::nullopt;
    // Prefer closing bytes as the text grows, so nested structures finish.
    const uint8_t b = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng)];
    std::string one(1, static_cast<char>(b));
    if (!m.accept(one)) return std::nullopt;
    m.compact();
    out += one;
  }
  return std::nullopt;
}

}  // namespace pagoda::grammar::testing
