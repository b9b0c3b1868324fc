#pragma once
// What turns a request into token ids, as one digest: SHA-256 over the bytes
// of a model directory's tokenizer.json, tokenizer_config.json (which holds
// the chat template and the special tokens) and chat_template.jinja, each
// tagged and length-prefixed, an absent file distinct from an empty one.
// `pagoda serve` advertises it (GET /v1/models, "tokenizer_fingerprint" of
// the model object); `pagoda route` computes it from its own --model and
// compares when a replica joins: equal digests mean both sides tokenize and
// render prompts alike, so the router's prefix hashes are the replica's.
//
// Thread safety: pure function (reads files).

#include <string>

#include "pagoda/core/status.h"

namespace pagoda::server {

// 64 lowercase hex digits; "" when the directory has no tokenizer.json (no
// text is tokenized there). kNotFound if `model_dir` is not a directory,
// kDataLoss naming a file that cannot be read.
StatusOr<std::string> tokenizer_fingerprint(const std::string& model_dir);

}  // namespace pagoda::server
