#pragma once
// Sampling on the GPU: one token per logits row without the logits leaving the
// device, with the CPU sampler's semantics (engine/sampler.h) minus penalties
// and top logprobs: temperature (0: argmax) -> min-p -> top-k -> top-p -> draw.
//
// One CTA per row, no sort of the vocabulary: a pass for the max and the raw
// log-sum-exp, then the top-k and top-p thresholds by bisection over the
// order-preserving 32-bit key of the logit (each pass counts / sums the mass
// above three probes, so ~16 passes per threshold), ties at a threshold cut
// by token id (lowest first, like the CPU's stable order), then Gumbel-max over
// the survivors with Philox-4x32-10 noise keyed by (seed, step, token id): a
// row's draw depends only on its own logits and key, never on the batch.
//
// Units and shapes: logits f32 [rows, vocab] row-major (device); params, tokens
// and logprobs [rows] (device). logprobs[r] = log-softmax of the RAW row at
// the chosen token (before temperature), like the OpenAI API. NaN logits are
// treated as -inf; a row with no finite logit yields its argmax with logprob -inf.
//
// Header is plain C++17 (included by .cu and .cpp files alike).
//
// Thread safety: enqueues on `stream`; no allocation, no synchronization
// (graph-capturable).

#include <cstdint>

#include <cuda_runtime_api.h>

namespace pagoda::cuda {

struct GpuSamplingParams {
  float temperature = 0.0f;  // 0: argmax (top_k etc. ignored)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  uint64_t seed = 0;         // per sequence
  uint64_t step = 0;         // per draw of that sequence (its output index)
};

cudaError_t sample_rows(const float* logits, int32_t rows, int32_t vocab, const GpuSamplingParams* params,
                        int32_t* tokens, float* logprobs, cudaStream_t stream);

// The uniform in (0, 1) the draw uses for (seed, step, token): exposed so tests
// can check the generator itself. Host-callable mirror of the device code.
double sampling_uniform(uint64_t seed, uint64_t step, int32_t token);

}  // namespace pagoda::cuda
