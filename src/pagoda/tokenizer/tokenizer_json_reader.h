#pragma once
// A JSON reader specialised for tokenizer.json: nearly all of the file is model.vocab (token -> id)
// and model.merges, which are streamed into flat vectors instead of a DOM; everything else
// becomes an nlohmann::json document. A DOM of a large vocabulary's file costs more to build and
// free than the whole load should take (docs/BENCHMARKS.md, "Tokenizer", has the figures).
//
// Strict JSON (RFC 8259). Errors are DATA_LOSS naming the file and the byte offset.
//
// Thread safety: stateless functions.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/status.h"

namespace pagoda::tokenizer {

struct TokenizerJson {
  nlohmann::json document;  // the whole file except model.vocab and model.merges
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // in file order
  // Merges in rank order: ["a", "b"] pairs, or "a b" strings split at their one space.
  std::vector<std::pair<std::string, std::string>> merges;
};

// `name` is used in error messages (the path).
StatusOr<TokenizerJson> read_tokenizer_json(std::string_view text, std::string_view name);

// tokenizer.json's "normalizer", "pre_tokenizer" and "decoder" are each one
// component {"type": T, ...} or {"type": "Sequence", <list_field>: [...]} of
// components (sequences nest). Calls add_one for every non-Sequence component in
// order, with `where` naming it for errors (e.g. "decoder.decoders[1]"). A null
// spec is no component. Malformed specs are DATA_LOSS naming the field.
using ComponentVisitor =
    std::function<Status(const nlohmann::json& spec, std::string_view where, const std::string& type)>;
Status for_each_component(const nlohmann::json& spec, std::string_view where, std::string_view list_field,
                          const ComponentVisitor& add_one);

}  // namespace pagoda::tokenizer
