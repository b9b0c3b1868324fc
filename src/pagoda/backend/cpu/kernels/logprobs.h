#pragma once
// Turning a row of logits into log-probabilities and the top-k (id, logprob)
// pairs that `--logprobs K` and the reference tests report.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pagoda::kernels {

// out[i] = logits[i] - logsumexp(logits), computed max-subtracted in f32 with a
// double-precision sum. out may alias logits.
void log_softmax(const float* logits, float* out, size_t n);

// The k largest values of row, largest first; ties go to the lower id.
// k is clamped to n.
std::vector<std::pair<int32_t, float>> top_k(const float* row, size_t n, size_t k);

// Index of the largest value (lowest index on ties); n must be > 0.
int32_t argmax(const float* row, size_t n);

}  // namespace pagoda::kernels
