#pragma once
// Where one request's time to first token went: the engine's debug view of a
// request from submit() to its first token, phase by phase, so that a slow
// host-tier hit can be told from a request that queued behind others or
// shared its first step with another prefill.
//
//   submit -> picked up by the engine thread -> admitted by the scheduler
//   (prefix lookup over the device and host tiers; a host hit's promotion
//   decided) -> its admission step's transfers handed to the runner (load
//   enqueued) -> those copies complete (reported by the runner) -> the first
//   forward containing the request -> that forward returned -> first token.
//
// Times are seconds after submit(); a phase that did not happen (no transfer
// in the admission step, a completion the runner does not report) is -1.
// Emitted once per request, on the engine thread, when its first token is
// appended (EngineConfig::timeline_sink).
//
// Thread safety: a plain value.

#include <cstdint>
#include <string>

namespace pagoda::engine {

struct RequestTimeline {
  uint64_t request_id = 0;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;       // prefix hit of either tier at admission
  int32_t host_hit_tokens = 0;     // of which in the host tier (promoted: loaded back)
  double picked_up_s = -1;         // drained from the submit queue by the engine thread
  double admitted_s = -1;          // admitted by the scheduler (lookup and promotion done)
  double load_enqueued_s = -1;     // the admission step's transfers handed to the runner
  double load_done_s = -1;         // ... and complete (runner's report; -1 when unknown)
  double first_step_start_s = -1;  // the first forward containing it was called
  double first_step_end_s = -1;    // ... and returned
  double first_token_s = -1;
  int32_t admission_h2d_blocks = 0;  // host->device blocks in its admission step's transfer list (all requests')
  int32_t admission_d2h_blocks = 0;  // device->host blocks in it
  int32_t admitted_with = 0;         // sequences admitted in the same step (itself included)
  int32_t first_step_sequences = 0;  // sequences in its first forward
  int32_t first_step_tokens = 0;     // new tokens in its first forward
  int32_t steps_before_first_token = 0;  // forwards that contained it before its first token (>= 1)
};

// One line: "request 7: prompt 9008 (cached 8000, host 7008): picked up 0.1 ms, admitted 20.3, load
// enqueued 20.9, load done 41.0, first step 21.0 -> 63.2 (2 seqs, 2008 tokens, 2 admitted), first token 63.3".
std::string format_timeline(const RequestTimeline& t);

}  // namespace pagoda::engine
