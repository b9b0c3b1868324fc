#pragma once
// The "normalizer" stage of tokenizer.json, applied to each piece of text between added tokens:
// Unicode normal forms (NFC, NFD, NFKC, NFKD through utf8proc), Lowercase, Prepend, Replace,
// Strip, and Sequence of those.
//
// Thread safety: immutable after from_json(); normalize() is const and reentrant.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"
#include "pagoda/tokenizer/pcre2_regex.h"

namespace pagoda::tokenizer {

class Normalizer {
 public:
  // `spec` is tokenizer.json's "normalizer" value (null means identity). `where` names the
  // field in error messages. UNIMPLEMENTED for types pagoda lacks.
  static StatusOr<Normalizer> from_json(const nlohmann::json& spec, std::string_view where);

  bool is_identity() const { return steps_.empty(); }

  // Normalizes valid UTF-8 `text` in place.
  void normalize(std::string& text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string text;                            // Prepend: what; Replace: the content
    std::shared_ptr<const Pcre2Regex> pattern;   // Replace with a {"Regex": ...} pattern
    std::string literal;                         // Replace with a {"String": ...} pattern
    bool strip_left = false, strip_right = false;
  };
  // One component (not a Sequence: for_each_component unrolls those).
  static Status add_step(const nlohmann::json& spec, std::string_view where, const std::string& type,
                         std::vector<Step>& steps);

  std::vector<Step> steps_;
};

// Exposed for tests: NFC through utf8proc, with a fast path for text that is already NFC by
// construction (ASCII, most CJK / kana / Hangul syllables).
std::string to_nfc(std::string_view text);

}  // namespace pagoda::tokenizer
