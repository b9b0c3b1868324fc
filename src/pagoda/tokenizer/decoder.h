#pragma once
// The "decoder" stage of tokenizer.json: turns the token strings of ids back into text, as HF
// tokenizers' decode_chain does. Supported: ByteLevel, Metaspace, Replace (String pattern),
// ByteFallback, Fuse, Strip, Sequence. No decoder: tokens joined with " " (HF's behaviour).
//
// The result is always valid UTF-8: ByteLevel decodes with U+FFFD for invalid sequences
// (maximal subparts, like from_utf8_lossy); ByteFallback turns a run of <0xAB> tokens that is not
// valid UTF-8 into one U+FFFD per byte, as HF does.
//
// Thread safety: immutable after from_json(); decode() is const and reentrant.

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {

class Decoder {
 public:
  static StatusOr<Decoder> from_json(const nlohmann::json& spec, std::string_view where);

  // `tokens`: token strings in order (special tokens already removed when skipping them).
  std::string decode(std::vector<std::string> tokens) const;

  // True when the chain contains a ByteLevel decoder (the vocab is in the byte-level alphabet).
  bool has_byte_level() const;
  bool has_byte_fallback() const;
  bool is_identity() const { return steps_.empty(); }

 private:
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  struct Step {
    Kind kind;
    std::string from, to;          // Replace; Metaspace: from = replacement
    bool strip_first_space = true; // Metaspace (prepend_scheme != never)
    char32_t strip_char = 0;       // Strip
    size_t strip_start = 0, strip_stop = 0;
  };
  // One component (not a Sequence: for_each_component unrolls those).
  static Status add_step(const nlohmann::json& spec, std::string_view where, const std::string& type,
                         std::vector<Step>& steps);

  std::vector<Step> steps_;
};

}  // namespace pagoda::tokenizer
