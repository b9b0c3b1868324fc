#pragma once
// Test helpers that write small Hugging Face checkpoints (config.json +
// safetensors, optionally sharded) with seeded random weights, so loader and
// forward tests run without downloaded files. Also the raw safetensors writer
// that the corruption tests start from.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/dtype.h"

namespace pagoda::testing {

struct TensorToWrite {
  DType dtype = DType::kF32;  // f32, f16 or bf16
  std::vector<int64_t> shape;
  std::vector<float> values;  // rounded to dtype on write
};
using TensorMap = std::map<std::string, TensorToWrite>;

// The bytes of a .safetensors file holding the tensors (in name order).
std::string safetensors_bytes(const TensorMap& tensors);
void write_file(const std::filesystem::path& path, const std::string& bytes);

struct TinyModelSpec {
  std::string architecture = "LlamaForCausalLM";
  DType dtype = DType::kF32;
  int32_t vocab_size = 96;
  int32_t hidden_size = 32;
  int32_t intermediate_size = 56;
  int32_t num_layers = 2;
  int32_t num_heads = 4;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 0;  // 0: hidden / heads, not written to config.json
  bool tie_word_embeddings = false;
  bool llama3_rope = false;
  bool rope_parameters_style = false;  // transformers 5: rope settings in rope_parameters
  float rope_theta = 10000.0f;
  int32_t num_shards = 1;  // > 1: model.safetensors.index.json + shards
  uint64_t seed = 1;
};

nlohmann::json tiny_config_json(const TinyModelSpec& spec);
// Every tensor the architecture needs, random (seeded), values already rounded to spec.dtype.
TensorMap tiny_model_tensors(const TinyModelSpec& spec);
// Writes config.json and the safetensors file(s) for these tensors.
void write_model_dir(const std::filesystem::path& dir, const nlohmann::json& config,
                     const TensorMap& tensors, int32_t num_shards = 1);
// tiny_config_json + tiny_model_tensors + write_model_dir; returns the tensors.
TensorMap write_tiny_model(const std::filesystem::path& dir, const TinyModelSpec& spec);

// A fresh empty directory under the system temp dir, unique per test.
std::filesystem::path make_temp_dir(const std::string& label);

}  // namespace pagoda::testing
