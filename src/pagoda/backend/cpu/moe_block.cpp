#include "pagoda/backend/cpu/moe_block.h"

#include <algorithm>

#include "pagoda/backend/cpu/kernels/matmul.h"
#include "pagoda/backend/cpu/kernels/moe_router.h"
#include "pagoda/backend/cpu/kernels/silu_mul.h"

namespace pagoda {

void CpuMoeBlock::run_mlp(const ExpertWeights& w, const float* x, size_t rows, float* out) {
  const size_t inter = w.gate_proj.rows;
  gate_.resize(rows * inter);
  up_.resize(rows * inter);
  kernels::linear(x, rows, w.gate_proj, nullptr, gate_.data());
  kernels::linear(x, rows, w.up_proj, nullptr, up_.data());
  kernels::silu_mul(gate_.data(), up_.data(), gate_.data(), rows * inter);
  kernels::linear(gate_.data(), rows, w.down_proj, nullptr, out);
}

void CpuMoeBlock::forward(const float* x, size_t num_tokens, const MoeLayerWeights& w, float* out) {
  const size_t experts = static_cast<size_t>(config_.num_experts);
  const size_t k = static_cast<size_t>(config_.experts_per_token);
  const size_t H = hidden_;
  logits_.resize(num_tokens * experts);
  kernels::linear(x, num_tokens, w.router, nullptr, logits_.data());
  indices_.resize(num_tokens * k);
  weights_.resize(num_tokens * k);
  kernels::moe_route(logits_.data(), num_tokens, config_,
                     w.score_correction_bias.empty() ? nullptr : w.score_correction_bias.data(), indices_.data(),
                     weights_.data());

  std::fill_n(out, num_tokens * H, 0.0f);
  // Tokens of each expert, in token order: (token, weight).
  std::vector<std::vector<std::pair<size_t, float>>> routed(experts);
  for (size_t t = 0; t < num_tokens; ++t)
    for (size_t i = 0; i < k; ++i)
      routed[static_cast<size_t>(indices_[t * k + i])].emplace_back(t, weights_[t * k + i]);
  for (size_t e = 0; e < experts; ++e) {
    const auto& tokens = routed[e];
    if (tokens.empty()) continue;
    rows_in_.resize(tokens.size() * H);
    rows_out_.resize(tokens.size() * H);
    for (size_t r = 0; r < tokens.size(); ++r) std::copy_n(x + tokens[r].first * H, H, rows_in_.data() + r * H);
    run_mlp(w.experts[e], rows_in_.data(), tokens.size(), rows_out_.data());
    for (size_t r = 0; r < tokens.size(); ++r) {
      float* dst = out + tokens[r].first * H;
      const float* src = rows_out_.data() + r * H;
      const float weight = tokens[r].second;
      for (size_t i = 0; i < H; ++i) dst[i] += src[i] * weight;
    }
  }
  if (w.shared.gate_proj.data != nullptr) {
    rows_out_.resize(num_tokens * H);
    run_mlp(w.shared, x, num_tokens, rows_out_.data());
    for (size_t i = 0; i < num_tokens * H; ++i) out[i] += rows_out_[i];
  }
}

}  // namespace pagoda
