#pragma once
// The "post_processor" stage of tokenizer.json, applied by encode(add_special_tokens=true): adds
// BOS/EOS-style ids around the encoded sequence. Supported: TemplateProcessing ("single"),
// BertProcessing / RobertaProcessing (cls + A + sep), ByteLevel (offsets only: no ids change),
// Sequence. Pair templates are not used by pagoda (single sequences only).
//
// Thread safety: immutable after from_json().

#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {

class PostProcessor {
 public:
  static StatusOr<PostProcessor> from_json(const nlohmann::json& spec, std::string_view where);

  // Wraps `ids` (the encoded text) with the template's special ids.
  void apply(std::vector<int32_t>& ids) const;

  // Ids added before / after the sequence.
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

}  // namespace pagoda::tokenizer
