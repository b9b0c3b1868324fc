#pragma once
// The MLP of a DeepSeek MoE layer on the CPU: router (f32 logits, then
// kernels/moe_router.h), each routed expert's SwiGLU run on the tokens routed
// to it (gathered into a dense block so every expert is one GEMM per
// projection) and added with its weight, then the shared experts on every
// token. f32 compute on f32 / f16 / bf16 weights (kernels/matmul.h).
//
// Thread safety: one forward at a time per block (scratch is reused); the
// GEMMs run on ThreadPool::global().

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagoda/model/deepseek_config.h"
#include "pagoda/model/deepseek_weights.h"

namespace pagoda {

class CpuMoeBlock {
 public:
  CpuMoeBlock(const MoeConfig& config, int32_t hidden_size) : config_(config), hidden_(hidden_size) {}

  // out[T, hidden] = MoE(x[T, hidden]); out must not alias x.
  void forward(const float* x, size_t num_tokens, const MoeLayerWeights& weights, float* out);

 private:
  void run_mlp(const ExpertWeights& w, const float* x, size_t rows, float* out);

  MoeConfig config_;
  size_t hidden_;
  // Scratch, reused across calls.
  std::vector<float> logits_, weights_, rows_in_, rows_out_, gate_, up_;
  std::vector<int32_t> indices_;
};

}  // namespace pagoda
