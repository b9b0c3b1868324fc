#pragma once
// ModelConfig: what pagoda needs from a Hugging Face config.json, checked.
//
// Supported architectures ("architectures"[0]): LlamaForCausalLM (incl.
// rope_scaling llama3), MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias),
// Qwen3ForCausalLM (q/k RMSNorm per head, explicit head_dim). MHA/GQA/MQA via
// num_key_value_heads. RoPE settings are read from rope_theta/rope_scaling
// (transformers 4) or rope_parameters (transformers 5).
// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM: multi-head latent attention
// and mixture of experts (model/deepseek_config.h); their KV cache is one
// latent vector per token and layer, which num_kv_heads (1) and head_dim
// (kv_lora_rank + qk_rope_head_dim) describe.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pagoda/core/dtype.h"
#include "pagoda/core/status.h"
#include "pagoda/model/deepseek_config.h"
#include "pagoda/model/fp8_config.h"
#include "pagoda/model/rope_frequencies.h"
#include "pagoda/model/yarn_rope.h"

namespace pagoda {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3, kDeepseekV2, kDeepseekV3 };

// "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, ...".
std::string supported_architectures();

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written in config.json

  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;   // == num_q_heads: MHA; 1: MQA; else GQA; MLA: 1 (the latent)
  int32_t head_dim = 0;       // may differ from hidden_size / num_q_heads (Qwen3); MLA: the latent's width
  int32_t max_position_embeddings = 0;

  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  std::optional<Llama3RopeScaling> rope_llama3;  // set for rope_type "llama3"
  std::optional<YarnRopeScaling> rope_yarn;      // set for rope_type "yarn" (DeepSeek)
  int32_t sliding_window = 0;  // 0: full attention (Mistral may set a window)

  bool tie_word_embeddings = false;  // lm_head shares embed_tokens
  bool qkv_bias = false;             // Qwen2 always; Llama/Qwen3 with attention_bias
  bool o_proj_bias = false;          // Llama/Qwen3 attention_bias
  bool mlp_bias = false;             // Llama mlp_bias
  bool qk_norm = false;              // Qwen3
  std::optional<MlaConfig> mla;      // DeepSeek V2/V3: multi-head latent attention
  std::optional<MoeConfig> moe;      // DeepSeek V2/V3: mixture of experts

  std::vector<int32_t> bos_token_ids;
  std::vector<int32_t> eos_token_ids;
  std::optional<DType> dtype;  // torch_dtype / dtype, when given: every weight must have it (fp8 Linear weights aside)
  // An FP8 checkpoint (quantization_config or ModelOpt's hf_quant_config.json): its Linear weights are
  // F8_E4M3 with scales (model/fp8_config.h); nullopt: not quantized.
  std::optional<Fp8QuantConfig> fp8;

  bool is_eos(int32_t token) const;
};

// source names the file in error messages ("models/x/config.json").
StatusOr<ModelConfig> parse_model_config(const nlohmann::json& json, std::string_view source);
// Reads <dir>/config.json; also takes eos_token_id from generation_config.json when present.
StatusOr<ModelConfig> load_model_config(const std::filesystem::path& model_dir);

}  // namespace pagoda
