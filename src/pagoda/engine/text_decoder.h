#pragma once
// The engine's seam to a tokenizer: turns a sequence's generated token ids
// into text incrementally, one token at a time, emitting only complete UTF-8
// (a token that ends mid-character yields "" until the character completes).
// Stop strings are matched on this text.
//
// Thread safety: one decoder per sequence, used by the engine thread only.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace pagoda::engine {

class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  // Appends one generated token; returns the newly completed text.
  virtual std::string append(int32_t token) = 0;
  // Text still buffered (an incomplete character at the end); called once at the end.
  virtual std::string finish() = 0;
};

// Makes a decoder for one sequence. `prompt_tail` is the end of the prompt, for
// tokenizers whose decoding depends on the previous token (leading spaces);
// `skip_special_tokens`: special tokens write no text (SamplingParams).
using TextDecoderFactory =
    std::function<std::unique_ptr<TextDecoder>(std::span<const int32_t> prompt_tail, bool skip_special_tokens)>;

// For models without a tokenizer (test fixtures): token t decodes to " <t>".
std::unique_ptr<TextDecoder> make_token_id_text_decoder();

}  // namespace pagoda::engine
