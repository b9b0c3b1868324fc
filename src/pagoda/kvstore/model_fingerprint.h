#pragma once
// The model fingerprint that stable KV block keys (kv/stable_key.h) are made
// under: SHA-256 over the model's config.json bytes, the header (length and
// JSON) of every *.safetensors file of the checkpoint in name order, and the
// KV settings that change a block's bytes (`kv_settings`: dtypes, block size,
// the device kind's block layout). Two servers with the same checkpoint and
// KV settings compute the same fingerprint on any machine; a changed weight
// file changes its header digest (offsets, shapes, dtypes, metadata) and thus
// every key. It reads headers only (kilobytes), never the weights.
//
// Thread safety: pure function (reads files).

#include <string>
#include <string_view>

#include "pagoda/core/status.h"

namespace pagoda::kvstore {

// `model_dir`: the checkpoint directory (empty for a bare config file: random
// weights, identified by config and `kv_settings`, which should then carry the
// weight seed). 64 hex digits. kNotFound / kDataLoss naming the file.
StatusOr<std::string> model_fingerprint(const std::string& model_dir, const std::string& config_path,
                                        std::string_view kv_settings);

}  // namespace pagoda::kvstore
