#pragma once
// The FP8 (float8_e4m3fn) weight checkpoint formats pagoda loads, read from
// config.json's quantization_config (ModelOpt: or from hf_quant_config.json):
//
//   compressed-tensors (llm-compressor): quant_method "compressed-tensors",
//     format "float-quantized"; one config group whose weights are
//     {type: float, num_bits: 8} with strategy tensor ([1] weight_scale),
//     channel ([out, 1]) or block (block_structure [bn, bk]:
//     [ceil(out/bn), ceil(in/bk)]); input_activations absent (weight only),
//     dynamic with strategy token or group (group_size), or static tensor
//     (an input_scale [1]); `ignore`: module names or "re:" regexes.
//   ModelOpt: quant_method "modelopt", quant_algo FP8 (per-tensor weight_scale
//     [] and static per-tensor input_scale []), FP8_PER_CHANNEL_PER_TOKEN
//     (weight_scale [out], dynamic per-token) or FP8_PB_WO (128x128 blocks,
//     weight_scale [out/128, 1, in/128, 1], dynamic per token per 128);
//     exclude_modules / ignore: names or fnmatch wildcards.
//   Block-wise fp8 (DeepSeek-V3, Qwen3-FP8, transformers' FineGrainedFP8):
//     quant_method "fp8", weight_block_size [bn, bk], weight_scale_inv
//     [ceil(out/bn), ceil(in/bk)], activations dynamic per token per bk
//     columns. Without weight_block_size: per-tensor weight_scale and, with
//     activation_scheme static, an input_scale. modules_to_not_convert skips.
//
// Every scale is a dequantization multiplier: w = fp8 * scale (the block
// format's weight_scale_inv is named for the inverse of the quantization
// scale; it multiplies too). An activation is quantized as
// x_q = fp8(x / s), with s = amax / 448 (dynamic, per token or per group)
// or the checkpoint's input_scale (static).
//
// Thread safety: a plain value.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/status.h"

namespace pagoda {

enum class Fp8Format : uint8_t { kCompressedTensors, kModelOpt, kBlockFp8, kOnline };
enum class Fp8WeightScale : uint8_t { kTensor, kChannel, kBlock };
enum class Fp8Activation : uint8_t {
  kNone,          // weight only: activations stay in the compute type
  kDynamicToken,  // one scale per token (row), amax / 448
  kDynamicGroup,  // one scale per token and group of `activation_group` columns
  kStaticTensor,  // the checkpoint's input_scale
};

struct Fp8QuantConfig {
  Fp8Format format = Fp8Format::kCompressedTensors;
  Fp8WeightScale weight_scale = Fp8WeightScale::kChannel;
  int32_t block_rows = 0, block_cols = 0;  // kBlock
  Fp8Activation activation = Fp8Activation::kDynamicToken;
  int32_t activation_group = 0;            // kDynamicGroup
  // The name of the scale tensor beside "<module>.weight": weight_scale or weight_scale_inv.
  std::string scale_name = "weight_scale";
  // Modules left unquantized: exact names, "re:<regex>" (compressed-tensors)
  // or wildcards with '*' (ModelOpt).
  std::vector<std::string> ignore;

  // True when module ("model.layers.0.mlp.down_proj", "lm_head") is not quantized.
  bool skips(const std::string& module) const;
  // "compressed-tensors fp8, per-channel weight scales, dynamic per-token activations".
  std::string describe() const;
};

// The quantization of a checkpoint: nullopt without quantization_config;
// an error naming the field for a method or scheme pagoda does not run
// (e.g. "quantization_config.quant_method 'gptq'").
StatusOr<std::optional<Fp8QuantConfig>> parse_fp8_quant_config(const nlohmann::json& config_json,
                                                               std::string_view source);

// ModelOpt's hf_quant_config.json ({"quantization": {"quant_algo": ...}}),
// for a config.json without quantization_config.
StatusOr<Fp8QuantConfig> parse_modelopt_quant_file(const nlohmann::json& file, std::string_view source);

}  // namespace pagoda
