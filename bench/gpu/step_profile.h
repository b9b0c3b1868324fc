#pragma once
// Where an engine run's time goes, step by step (pagoda_gpu_engine_bench):
// every runner call is recorded (start offset, seconds inside the runner,
// prefill tokens, decode rows, free KV blocks before the step), and
// print_step_profile() summarises them as
//   - prefill-carrying steps vs decode-only steps (count, seconds, share of
//     the wall, prefill tokens per step, achieved TFLOP/s of the linear layers
//     in the prefill-carrying steps),
//   - decode-only steps by batch size (a histogram: steps, ms per step,
//     output tok/s inside those steps),
//   - a timeline in tenths of the wall (steps, prefill tokens, mean decode
//     batch, fewest free KV blocks).
// A row counts as a decode when it brings one new token (num_new_tokens == 1);
// a one-token prefill chunk would count as a decode (rare: chunks fill the budget).
//
// Thread safety: record() from the engine thread only (inside execute()); print
// after the engine has stopped.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace pagoda::bench {

struct StepRecord {
  double start_s = 0;    // since the run's t0
  double seconds = 0;    // inside the runner (it synchronizes)
  int32_t prefill_tokens = 0;
  int32_t decode_rows = 0;
  int32_t free_blocks = -1;  // KV blocks on the free list before the step (-1: unknown)
};

// Linear-layer FLOPs of one token through the model (2 x the weights of the
// attention and MLP projections; lm_head only on the rows that produce logits).
struct ModelFlops {
  double per_token = 0;     // 2 x (qkv + o + gate_up + down) x layers
  double per_logit_row = 0; // 2 x hidden x vocab
};

inline ModelFlops llama_linear_flops(int64_t hidden, int64_t intermediate, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, int64_t layers, int64_t vocab) {
  const double qkv = double(hidden) * double((heads + 2 * kv_heads) * head_dim);
  const double o = double(heads * head_dim) * double(hidden);
  const double mlp = 3.0 * double(hidden) * double(intermediate);
  return {2.0 * (qkv + o + mlp) * double(layers), 2.0 * double(hidden) * double(vocab)};
}

inline void print_step_profile(const char* label, const std::vector<StepRecord>& steps, double wall_s,
                               const ModelFlops& flops, int64_t kv_blocks, int64_t preemptions) {
  if (steps.empty() || wall_s <= 0) return;
  int64_t prefill_steps = 0, decode_steps = 0, prefill_tokens = 0, mixed_decode_rows = 0, decode_rows = 0;
  double prefill_s = 0, decode_s = 0, runner_s = 0;
  int32_t min_free = -1, max_prefill = 0;
  for (const StepRecord& s : steps) {
    runner_s += s.seconds;
    if (s.free_blocks >= 0) min_free = min_free < 0 ? s.free_blocks : std::min(min_free, s.free_blocks);
    if (s.prefill_tokens > 0) {
      ++prefill_steps;
      prefill_s += s.seconds;
      prefill_tokens += s.prefill_tokens;
      mixed_decode_rows += s.decode_rows;
      max_prefill = std::max(max_prefill, s.prefill_tokens);
    } else {
      ++decode_steps;
      decode_s += s.seconds;
      decode_rows += s.decode_rows;
    }
  }
  std::printf("  [step profile] %s: wall %.1f s, runner %.1f s (%.0f%%), engine host %.1f s; %lld preemptions; "
              "KV pool %lld blocks, fewest free %d\n",
              label, wall_s, runner_s, 100 * runner_s / wall_s, wall_s - runner_s, (long long)preemptions,
              (long long)kv_blocks, min_free);
  if (prefill_steps > 0) {
    // Linear FLOPs of the prefill-carrying steps: their prefill tokens and their decode rows.
    const double f = flops.per_token * double(prefill_tokens + mixed_decode_rows);
    std::printf("  [step profile] prefill-carrying steps: %lld, %.1f s (%.0f%% of wall), %.0f ms each; %lld prefill "
                "tokens, %.0f per step (max %d) + %.0f decode rows per step; %.0f prefill tok/s inside them; "
                "linear layers %.0f TFLOP/s\n",
                (long long)prefill_steps, prefill_s, 100 * prefill_s / wall_s, 1e3 * prefill_s / prefill_steps,
                (long long)prefill_tokens, double(prefill_tokens) / prefill_steps, max_prefill,
                double(mixed_decode_rows) / prefill_steps, prefill_tokens / prefill_s, f / prefill_s / 1e12);
  }
  if (decode_steps > 0)
    std::printf("  [step profile] decode-only steps: %lld, %.1f s (%.0f%% of wall), %.2f ms each at mean batch %.1f: "
                "%.0f tok/s inside them\n",
                (long long)decode_steps, decode_s, 100 * decode_s / wall_s, 1e3 * decode_s / decode_steps,
                double(decode_rows) / decode_steps, decode_rows / decode_s);
  // Decode-only steps by batch.
  constexpr std::array<int32_t, 9> edges = {1, 32, 64, 128, 192, 256, 320, 384, 512};
  std::array<int64_t, edges.size()> n{}, rows{};
  std::array<double, edges.size()> secs{};
  for (const StepRecord& s : steps) {
    if (s.prefill_tokens > 0) continue;
    size_t b = 0;
    while (b + 1 < edges.size() && s.decode_rows >= edges[b + 1]) ++b;
    ++n[b];
    rows[b] += s.decode_rows;
    secs[b] += s.seconds;
  }
  std::printf("  [step profile] decode-only by batch (rows: steps, ms/step, tok/s):");
  for (size_t b = 0; b < edges.size(); ++b) {
    if (n[b] == 0) continue;
    if (b + 1 < edges.size())
      std::printf(" %d-%d: %lld, %.2f, %.0f;", edges[b], edges[b + 1] - 1, (long long)n[b], 1e3 * secs[b] / n[b],
                  rows[b] / secs[b]);
    else
      std::printf(" %d+: %lld, %.2f, %.0f;", edges[b], (long long)n[b], 1e3 * secs[b] / n[b], rows[b] / secs[b]);
  }
  std::printf("\n");
  // Timeline in tenths of the wall.
  std::printf("  [step profile] timeline (tenth of wall: steps, prefill tok, mean decode rows, runner s, fewest free blocks):");
  for (int t = 0; t < 10; ++t) {
    const double lo = wall_s * t / 10, hi = wall_s * (t + 1) / 10;
    int64_t k = 0, p = 0, d = 0;
    double r = 0;
    int32_t fewest = -1;
    for (const StepRecord& s : steps) {
      if (s.start_s < lo || s.start_s >= hi) continue;
      ++k;
      p += s.prefill_tokens;
      d += s.decode_rows;
      r += s.seconds;
      if (s.free_blocks >= 0) fewest = fewest < 0 ? s.free_blocks : std::min(fewest, s.free_blocks);
    }
    std::printf(" [%d] %lld, %lld, %.0f, %.1f, %d;", t, (long long)k, (long long)p, k ? double(d) / k : 0.0, r, fewest);
  }
  std::printf("\n");
}

}  // namespace pagoda::bench
