#pragma once
// The engine's TextDecoder over a Hugging Face tokenizer: generated ids become
// whole UTF-8 text one token at a time (special tokens skipped), for serve and
// generate alike. Lives in cli/ because the engine never sees a tokenizer.
//
// Thread safety: one decoder per sequence (engine thread).

#include <memory>

#include "pagoda/engine/text_decoder.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {

// A factory for EngineConfig::text_decoder_factory.
engine::TextDecoderFactory make_tokenizer_text_decoder_factory(std::shared_ptr<const tokenizer::Tokenizer> tok);

}  // namespace pagoda::cli
