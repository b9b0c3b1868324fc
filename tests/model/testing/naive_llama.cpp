#include "model/testing/naive_llama.h"

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace pagoda::testing {

namespace {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

const TensorToWrite& get(const TensorMap& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end()) throw std::runtime_error("naive model: missing " + name);
  return it->second;
}

// y = x W^T (+ b), W stored [out, in].
Matrix linear(const Matrix& x, const TensorToWrite& w, const TensorToWrite* bias) {
  const size_t out = static_cast<size_t>(w.shape[0]), in = static_cast<size_t>(w.shape[1]);
  Matrix y(x.size(), std::vector<double>(out, 0.0));
  for (size_t r = 0; r < x.size(); ++r)
    for (size_t o = 0; o < out; ++o) {
      double s = bias ? bias->values[o] : 0.0;
      for (size_t i = 0; i < in; ++i) s += x[r][i] * w.values[o * in + i];
      y[r][o] = s;
    }
  return y;
}

// RMSNorm over consecutive groups of `dim` values of each row.
void rms_norm(Matrix& x, const TensorToWrite& w, double eps, size_t dim) {
  for (auto& row : x)
    for (size_t g = 0; g + dim <= row.size(); g += dim) {
      double ss = 0;
      for (size_t i = 0; i < dim; ++i) ss += row[g + i] * row[g + i];
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (size_t i = 0; i < dim; ++i) row[g + i] = row[g + i] * inv * w.values[i];
    }
}

std::vector<double> inverse_frequencies(const nlohmann::json& c, size_t head_dim) {
  const nlohmann::json& rope = c.contains("rope_parameters") ? c["rope_parameters"]
                               : c.contains("rope_scaling")  ? c["rope_scaling"]
                                                             : nlohmann::json();
  const double theta = c.contains("rope_theta") ? c["rope_theta"].get<double>()
                                                : rope.value("rope_theta", 10000.0);
  std::vector<double> inv(head_dim / 2);
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0 / std::pow(theta, (2.0 * i) / head_dim);
  if (!rope.is_object() || rope.value("rope_type", "default") != "llama3") return inv;
  // transformers _compute_llama3_parameters, element by element.
  const double factor = rope["factor"], low = rope["low_freq_factor"], high = rope["high_freq_factor"];
  const double old_ctx = rope["original_max_position_embeddings"];
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    double scaled = wavelen > old_ctx / low ? f / factor : f;
    const bool medium = !(wavelen < old_ctx / high) && !(wavelen > old_ctx / low);
    if (medium) {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      scaled = (1 - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
  return inv;
}

void rope(Matrix& x, size_t heads, size_t head_dim, const std::vector<double>& inv) {
  for (size_t pos = 0; pos < x.size(); ++pos)
    for (size_t h = 0; h < heads; ++h) {
      double* v = x[pos].data() + h * head_dim;
      std::vector<double> rotated(head_dim);
      for (size_t i = 0; i < head_dim; ++i) {
        const size_t f = i % (head_dim / 2);
        const double angle = static_cast<double>(static_cast<float>(pos) * static_cast<float>(inv[f]));
        // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
        const double rot = i < head_dim / 2 ? -v[i + head_dim / 2] : v[i - head_dim / 2];
        rotated[i] = v[i] * std::cos(angle) + rot * std::sin(angle);
      }
      std::copy(rotated.begin(), rotated.end(), v);
    }
}

}  // namespace

std::vector<std::vector<float>> naive_llama_logits(const nlohmann::json& c, const TensorMap& t,
                                                   const std::vector<int32_t>& tokens) {
  const std::string arch = c["architectures"][0];
  const size_t hidden = c["hidden_size"], layers = c["num_hidden_layers"];
  const size_t heads = c["num_attention_heads"], kv_heads = c["num_key_value_heads"];
  const size_t head_dim = c.contains("head_dim") ? c["head_dim"].get<size_t>() : hidden / heads;
  const double eps = c["rms_norm_eps"];
  const size_t n = tokens.size();
  const auto inv = inverse_frequencies(c, head_dim);

  const auto& embed = get(t, "model.embed_tokens.weight");
  Matrix x(n, std::vector<double>(hidden));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < hidden; ++j) x[i][j] = embed.values[tokens[i] * hidden + j];

  for (size_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto find = [&](const std::string& name) -> const TensorToWrite* {
      auto it = t.find(p + name);
      return it == t.end() ? nullptr : &it->second;
    };
    Matrix h = x;
    rms_norm(h, get(t, p + "input_layernorm.weight"), eps, hidden);
    Matrix q = linear(h, get(t, p + "self_attn.q_proj.weight"), find("self_attn.q_proj.bias"));
    Matrix k = linear(h, get(t, p + "self_attn.k_proj.weight"), find("self_attn.k_proj.bias"));
    Matrix v = linear(h, get(t, p + "self_attn.v_proj.weight"), find("self_attn.v_proj.bias"));
    if (arch == "Qwen3ForCausalLM") {
      rms_norm(q, get(t, p + "self_attn.q_norm.weight"), eps, head_dim);
      rms_norm(k, get(t, p + "self_attn.k_norm.weight"), eps, head_dim);
    }
    rope(q, heads, head_dim, inv);
    rope(k, kv_heads, head_dim, inv);
    Matrix attn(n, std::vector<double>(heads * head_dim, 0.0));
    for (size_t i = 0; i < n; ++i)
      for (size_t hq = 0; hq < heads; ++hq) {
        const size_t hk = hq / (heads / kv_heads);
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (size_t d = 0; d < head_dim; ++d) dot += q[i][hq * head_dim + d] * k[j][hk * head_dim + d];
          s[j] = dot / std::sqrt(static_cast<double>(head_dim));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= i; ++j)
          for (size_t d = 0; d < head_dim; ++d)
            attn[i][hq * head_dim + d] += s[j] / sum * v[j][hk * head_dim + d];
      }
    Matrix o = linear(attn, get(t, p + "self_attn.o_proj.weight"), find("self_attn.o_proj.bias"));
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < hidden; ++j) x[i][j] += o[i][j];
    h = x;
    rms_norm(h, get(t, p + "post_attention_layernorm.weight"), eps, hidden);
    Matrix g = linear(h, get(t, p + "mlp.gate_proj.weight"), nullptr);
    Matrix u = linear(h, get(t, p + "mlp.up_proj.weight"), nullptr);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < g[i].size(); ++j) g[i][j] = g[i][j] / (1 + std::exp(-g[i][j])) * u[i][j];
    Matrix down = linear(g, get(t, p + "mlp.down_proj.weight"), nullptr);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < hidden; ++j) x[i][j] += down[i][j];
  }
  rms_norm(x, get(t, "model.norm.weight"), eps, hidden);
  const bool tied = c.value("tie_word_embeddings", false);
  Matrix logits = linear(x, tied ? embed : get(t, "lm_head.weight"), nullptr);
  std::vector<std::vector<float>> out(n);
  for (size_t i = 0; i < n; ++i) out[i].assign(logits[i].begin(), logits[i].end());
  return out;
}

}  // namespace pagoda::testing
