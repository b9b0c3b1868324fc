#include "model/testing/tiny_checkpoint.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <fmt/format.h>

namespace pagoda::testing {

namespace {

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    default: return "?";
  }
}

float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    case DType::kBF16: return round_to_bf16(v);
    default: return v;
  }
}

void append_encoded(std::string& out, DType dtype, const std::vector<float>& values) {
  for (float v : values) {
    if (dtype == DType::kF32) {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t bits = dtype == DType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
      out.append(reinterpret_cast<const char*>(&bits), 2);
    }
  }
}

}  // namespace

std::string safetensors_bytes(const TensorMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const size_t begin = data.size();
    append_encoded(data, t.dtype, t.values);
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape},
                    {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string header_text = header.dump();
  while (header_text.size() % 8 != 0) header_text += ' ';  // as the reference writer pads
  const uint64_t len = header_text.size();
  std::string out(reinterpret_cast<const char*>(&len), 8);
  return out + header_text + data;
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

nlohmann::json tiny_config_json(const TinyModelSpec& s) {
  nlohmann::json c = {
      {"architectures", {s.architecture}},
      {"model_type", "llama"},
      {"vocab_size", s.vocab_size},
      {"hidden_size", s.hidden_size},
      {"intermediate_size", s.intermediate_size},
      {"num_hidden_layers", s.num_layers},
      {"num_attention_heads", s.num_heads},
      {"num_key_value_heads", s.num_kv_heads},
      {"hidden_act", "silu"},
      {"max_position_embeddings", 256},
      {"rms_norm_eps", 1e-5},
      {"tie_word_embeddings", s.tie_word_embeddings},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"torch_dtype", s.dtype == DType::kF32 ? "float32" : s.dtype == DType::kF16 ? "float16" : "bfloat16"},
  };
  if (s.head_dim > 0) c["head_dim"] = s.head_dim;
  nlohmann::json scaling = nullptr;
  if (s.llama3_rope) {
    scaling = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 256}};
  }
  if (s.rope_parameters_style) {
    nlohmann::json params = scaling.is_null() ? nlohmann::json{{"rope_type", "default"}} : scaling;
    params["rope_theta"] = s.rope_theta;
    c["rope_parameters"] = params;
  } else {
    c["rope_theta"] = s.rope_theta;
    if (!scaling.is_null()) c["rope_scaling"] = scaling;
  }
  return c;
}

TensorMap tiny_model_tensors(const TinyModelSpec& s) {
  std::mt19937_64 rng(s.seed);
  TensorMap m;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float center, float spread) {
    TensorToWrite t{s.dtype, shape, {}};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> dist(-spread, spread);
    t.values.resize(static_cast<size_t>(n));
    for (float& v : t.values) v = round_to(s.dtype, center + dist(rng));
    m[name] = std::move(t);
  };
  const int64_t hidden = s.hidden_size, inter = s.intermediate_size;
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : hidden / s.num_heads;
  const int64_t q_out = s.num_heads * head_dim, kv_out = s.num_kv_heads * head_dim;
  // Spreads large enough that attention is not uniform and logits are not flat.
  const float w_in = 1.7f / std::sqrt(static_cast<float>(hidden));
  add("model.embed_tokens.weight", {s.vocab_size, hidden}, 0.0f, 1.0f);
  for (int32_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, 1.0f, 0.2f);
    add(p + "post_attention_layernorm.weight", {hidden}, 1.0f, 0.2f);
    add(p + "self_attn.q_proj.weight", {q_out, hidden}, 0.0f, w_in * 1.5f);
    add(p + "self_attn.k_proj.weight", {kv_out, hidden}, 0.0f, w_in * 1.5f);
    add(p + "self_attn.v_proj.weight", {kv_out, hidden}, 0.0f, w_in);
    add(p + "self_attn.o_proj.weight", {hidden, q_out}, 0.0f, 1.7f / std::sqrt(static_cast<float>(q_out)));
    if (s.architecture == "Qwen2ForCausalLM") {
      add(p + "self_attn.q_proj.bias", {q_out}, 0.0f, 0.3f);
      add(p + "self_attn.k_proj.bias", {kv_out}, 0.0f, 0.3f);
      add(p + "self_attn.v_proj.bias", {kv_out}, 0.0f, 0.3f);
    }
    if (s.architecture == "Qwen3ForCausalLM") {
      add(p + "self_attn.q_norm.weight", {head_dim}, 1.0f, 0.3f);
      add(p + "self_attn.k_norm.weight", {head_dim}, 1.0f, 0.3f);
    }
    add(p + "mlp.gate_proj.weight", {inter, hidden}, 0.0f, w_in);
    add(p + "mlp.up_proj.weight", {inter, hidden}, 0.0f, w_in);
    add(p + "mlp.down_proj.weight", {hidden, inter}, 0.0f, 1.7f / std::sqrt(static_cast<float>(inter)));
  }
  add("model.norm.weight", {hidden}, 1.0f, 0.2f);
  if (!s.tie_word_embeddings) add("lm_head.weight", {s.vocab_size, hidden}, 0.0f, w_in * 2.0f);
  return m;
}

void write_model_dir(const std::filesystem::path& dir, const nlohmann::json& config,
                     const TensorMap& tensors, int32_t num_shards) {
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", config.dump(2));
  if (num_shards <= 1) {
    write_file(dir / "model.safetensors", safetensors_bytes(tensors));
    return;
  }
  std::vector<TensorMap> shards(static_cast<size_t>(num_shards));
  nlohmann::json weight_map = nlohmann::json::object();
  size_t i = 0;
  for (const auto& [name, t] : tensors) {
    const size_t shard = i++ % shards.size();
    shards[shard][name] = t;
    weight_map[name] = fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, shards.size());
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    write_file(dir / fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size()),
               safetensors_bytes(shards[s]));
  }
  write_file(dir / "model.safetensors.index.json",
             nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2));
}

TensorMap write_tiny_model(const std::filesystem::path& dir, const TinyModelSpec& spec) {
  TensorMap tensors = tiny_model_tensors(spec);
  write_model_dir(dir, tiny_config_json(spec), tensors, spec.num_shards);
  return tensors;
}

std::filesystem::path make_temp_dir(const std::string& label) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = "pagoda_" + label;
  if (info != nullptr) name += std::string("_") + info->test_suite_name() + "_" + info->name();
  for (char& ch : name)
    if (ch == '/') ch = '_';
  const auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace pagoda::testing
