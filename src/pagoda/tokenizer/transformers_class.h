#pragma once
// How transformers 5's AutoTokenizer reads a tokenizer directory, where that differs from running
// tokenizer.json literally (as the `tokenizers` library does).
//
// transformers 5 loads tokenizer.json as is for the generic class (tokenizer_class
// "PreTrainedTokenizerFast" / TokenizersBackend) and for classes without a constructor of their
// own. A class that has one keeps only the vocabulary, the merges and the post-processor of
// tokenizer.json and rebuilds the rest from tokenizer_config.json. Of the classes pagoda loads,
// that matters for:
//
//   LlamaTokenizer / LlamaTokenizerFast (sentencepiece BPE with byte fallback: Llama 2, Mistral,
//   and many fine-tunes): no normalizer; a Metaspace pre-tokenizer ("▁" for spaces, no split)
//   whose prepend_scheme is "never" when add_prefix_space is false, else "always" when the
//   config says legacy: true and "first" otherwise (legacy defaults to false, add_prefix_space
//   to true); the decoder Replace("▁", " "), ByteFallback, Fuse, plus Strip(one leading space)
//   when add_prefix_space. The model becomes BPE with byte_fallback and fuse_unk.
//   Compared with a tokenizer.json that prepends "▁" in its normalizer, text that already starts
//   with a space gets no extra "▁" (" " -> "▁", not "▁▁"), and with prepend_scheme "first"
//   text after a special token gets none either.
//
// For every class, when tokenizer_config.json sets add_bos_token or add_eos_token, transformers
// replaces the post-processor by bos? $A eos? built from those flags (a missing flag is false; a
// flag whose token is unset adds nothing).
//
// Other classes (Qwen2Tokenizer, GPT2-style and the generic class) are left as tokenizer.json says:
// transformers' rebuilt pipeline for them is the one their tokenizer.json files already hold, and
// the reference fixtures (tests/fixtures/tokenizer) agree.
//
// Thread safety: stateless functions.

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {

// The parts of tokenizer.json that a tokenizer class may rebuild; `model` holds the model's
// settings only (type, byte_fallback, fuse_unk, ...), not its vocabulary.
struct PipelineSpecs {
  nlohmann::json normalizer;
  nlohmann::json pre_tokenizer;
  nlohmann::json post_processor;
  nlohmann::json decoder;
  nlohmann::json model;
};

// What was applied, for start-up reports and tests.
struct TransformersClassReport {
  std::string tokenizer_class;   // from tokenizer_config.json ("" when absent)
  bool pipeline_rebuilt = false;       // normalizer / pre-tokenizer / decoder replaced
  bool post_processor_rebuilt = false; // add_bos_token / add_eos_token applied
};

// Rewrites `specs` the way transformers 5 would for `tokenizer_config` (tokenizer_config.json's
// object; null or empty: nothing changes). `token_id` looks a token string up in the vocabulary
// (for the BOS/EOS ids of a rebuilt post-processor). Errors: DATA_LOSS naming the config field
// when a flag has the wrong type or a BOS/EOS token the post-processor needs is not a token.
StatusOr<TransformersClassReport> apply_transformers_class(
    const nlohmann::json& tokenizer_config,
    const std::function<std::optional<int32_t>(const std::string&)>& token_id,
    std::string_view config_name, PipelineSpecs& specs);

}  // namespace pagoda::tokenizer
