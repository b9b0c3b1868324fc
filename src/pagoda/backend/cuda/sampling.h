#pragma once
// Sampling on the GPU: one token per logits row without the logits leaving the
// device, with the CPU sampler's semantics (engine/sampler.h): logit rules and
// penalties (apply_logit_edits before the draw, restore_logit_edits after it) ->
// temperature (0: argmax) -> min-p -> top-k -> top-p -> draw; and the scores
// of given or drawn tokens (score_rows: prompt scoring, top logprobs).
//
// One CTA per row, no sort of the vocabulary (sampling.cu): one pass for the
// max and the raw log-sum-exp (online); the min-p threshold by a search over
// key values that reads no memory; the top-k and top-p thresholds by radix
// select over the logits' order-preserving 32-bit keys (a histogram of the
// top 12 key bits, weighted by count for top-k and by exact fixed-point
// probability mass for top-p, then 10 + 10 bits inside the chosen bucket:
// sampling_select.h); ties at a threshold cut by token id (lowest first, like
// the CPU's stable order); then Gumbel-max over the survivors with
// Philox-4x32-10 noise keyed by (seed, step, token id): a row's draw depends
// only on its own logits and key, never on the batch.
//
// Agreement with the CPU sampler: the kept set is the CPU's except where the
// top-p target lies within float rounding (~1e-7 relative) of a cumulative-mass
// boundary (the kernel weighs tokens by expf in float, the CPU by exp in
// double); equal logits are equal keys and are cut by id exactly like the CPU.
// Thresholds are deterministic: the same row gives the same cuts on every run.
//
// Units and shapes: logits f32 [rows, vocab] row-major (device); params, tokens,
// logprobs and cuts [rows] (device). logprobs[r] = log-softmax of the RAW row at
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

// The thresholds a row was sampled under, for tests and diagnostics: a token
// with cleaned logit v (NaN -> -inf) and key k = order_key(v)
// (sampling_select.h) was a candidate iff it passes all three cuts, each
// "k > cut key, or k == cut key and id < cut id". Greedy rows (and rows with
// no finite logit) report cuts that keep only the chosen argmax.
struct GpuSamplingCuts {
  uint32_t min_p_key = 0;  // id cut: none (every id passes at the key)
  uint32_t top_k_key = 0;
  int32_t top_k_id = 0;
  uint32_t top_p_key = 0;
  int32_t top_p_id = 0;
};

cudaError_t sample_rows(const float* logits, int32_t rows, int32_t vocab, const GpuSamplingParams* params,
                        int32_t* tokens, float* logprobs, cudaStream_t stream);

// The same, also writing each row's cuts to `cuts` [rows] (device; may be null).
cudaError_t sample_rows_with_cuts(const float* logits, int32_t rows, int32_t vocab, const GpuSamplingParams* params,
                                  int32_t* tokens, float* logprobs, GpuSamplingCuts* cuts, cudaStream_t stream);

// Structured outputs: for k < count, sets logits[rows[k]][t] = -inf for every token t whose bit
// is clear in masks[k] (ceil(vocab / 64) words per mask, 64 tokens per word, least significant
// bit first: runtime::RowSampling::allowed). rows and masks are device memory. Run before
// sample_rows, the masked rows' logprobs are those of the masked distribution.
cudaError_t apply_token_masks(float* logits, int32_t vocab, const int32_t* rows, const uint64_t* masks,
                              int32_t count, cudaStream_t stream);

// Overlapped steps (ModelRunner::launch): for k < count, token_ids[pairs[2k]] = sampled[pairs[2k + 1]]:
// a step's inputs that are the tokens the step before it sampled, still on the device. All device memory.
cudaError_t patch_deferred_tokens(int32_t* token_ids, const int32_t* pairs, int32_t count, const int32_t* sampled,
                                  cudaStream_t stream);

// Prompt scoring (prompt_logprobs, echo): a token the model was given rather
// than drew, scored where its logits row is, so only the score crosses to the
// host instead of the row (~0.5 MB at a 128K vocabulary). The CPU's
// engine::score_token semantics: the token's log-softmax in the raw row; its
// rank, the tokens whose logit is >= its own, itself included (vLLM's); and
// the top_k most likely tokens, best first, ties to the lower id. NaN logits
// count as -inf (as in sample_rows); a row with no finite logit scores -inf.
inline constexpr int32_t kMaxScoreTopK = 20;  // the API's cap on prompt_logprobs
struct GpuScoreRequest {
  int32_t row = 0;    // the logits row
  int32_t token = 0;  // in [0, vocab); < 0: the token sample_rows drew for the row (score_rows' `sampled`)
  int32_t top_k = 0;  // [0, kMaxScoreTopK]
};
struct GpuRowScore {
  float logprob = 0.0f;
  int32_t rank = 0;
  int32_t top_count = 0;  // min(top_k, vocab)
  int32_t top_tokens[kMaxScoreTopK] = {};
  float top_logprobs[kMaxScoreTopK] = {};
};

// One CTA per request: scores[k] for requests[k], k < count; `sampled` [rows]: sample_rows' tokens, read
// for requests with token < 0 (may be null without such requests). Device memory.
cudaError_t score_rows(const float* logits, int32_t vocab, const GpuScoreRequest* requests, int32_t count,
                       GpuRowScore* scores, cudaStream_t stream, const int32_t* sampled = nullptr);

// Logit edits (runtime::RowSampling::logit_edits: logit rules and penalties,
// the CPU's arithmetic in the same float operations, none contracted): for
// k < count, each token t listed for rows[k] has its logit v replaced by -inf
// if banned, else by v + bias if biased; then, if seen and repetition != 1,
// by v / repetition where v > 0 and by v x repetition elsewhere; then, with an
// output count c > 0 (and frequency or presence set), by
// v - (frequency x c + presence). The logit before is kept in the entry's
// `saved`; restore_logit_edits writes it back, so a row's scores (its reported
// logprob, top logprobs) are taken from the raw row after the draw. Tokens
// outside [0, vocab) are skipped. One CTA per row; a row's tokens must be
// distinct. Device memory.
struct GpuLogitEditRow {
  int32_t row = 0;    // the logits row
  int32_t first = 0;  // its tokens: edits[first, first + count)
  int32_t count = 0;
  float repetition = 1.0f;
  float frequency = 0.0f;
  float presence = 0.0f;
};
inline constexpr uint32_t kLogitEditSeen = 1, kLogitEditBanned = 2, kLogitEditBiased = 4;
struct GpuLogitEdit {
  int32_t token = 0;
  int32_t output_count = 0;
  float bias = 0.0f;   // with kLogitEditBiased
  uint32_t flags = 0;  // kLogitEdit*
  float saved = 0.0f;  // written by apply_logit_edits
};
cudaError_t apply_logit_edits(float* logits, int32_t vocab, const GpuLogitEditRow* rows, int32_t count,
                              GpuLogitEdit* edits, cudaStream_t stream);
cudaError_t restore_logit_edits(float* logits, int32_t vocab, const GpuLogitEditRow* rows, int32_t count,
                                const GpuLogitEdit* edits, cudaStream_t stream);

// The uniform in (0, 1) the draw uses for (seed, step, token): exposed so tests
// can check the generator itself. Host-callable mirror of the device code.
double sampling_uniform(uint64_t seed, uint64_t step, int32_t token);

}  // namespace pagoda::cuda
