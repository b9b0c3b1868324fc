#pragma once
// Engine-internal state of one request (RequestState) and of each of its
// choices (Sequence). A request with n > 1 starts as one sequence and forks
// the other n - 1 after its prompt is computed, sharing the prompt's KV blocks
// copy-on-write.
//
// A sequence's `tokens` are its prompt followed by what it generated; the
// first `num_computed` have K/V in the pool and the first `num_reserved` have
// slots. Preemption by recompute drops both to 0 and keeps `tokens`, so the
// sequence resumes exactly where it stopped (prefix-cache hits make the
// recompute cheap). Preemption by swap keeps both: the K/V waits in the host
// tier (`swapped`) and comes back before the sequence runs again.
//
// Thread safety: engine thread only.

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagoda/engine/request.h"
#include "pagoda/engine/request_timeline.h"
#include "pagoda/engine/sampler.h"
#include "pagoda/engine/stop_string_matcher.h"
#include "pagoda/engine/text_decoder.h"
#include "pagoda/kv/block_hashes.h"
#include "pagoda/kv/kv_types.h"

namespace pagoda::engine {

using Clock = std::chrono::steady_clock;

enum class SequenceStatus { kWaiting, kRunning, kFinished };

// A token sampled on the device and not collected yet (Sequence::tokens).
inline constexpr int32_t kPendingToken = -1;

struct RequestState;

struct Sequence {
  kv::SequenceId id = 0;
  RequestState* request = nullptr;
  int32_t choice_index = 0;
  uint64_t arrival_order = 0;  // FCFS key; forks inherit their parent's

  std::vector<int32_t> tokens;
  // Content hashes of tokens' full blocks, extended as tokens arrive: a waiting
  // sequence is matched against the prefix cache without re-hashing.
  kv::BlockHashes block_hashes;
  int32_t prompt_length = 0;
  int32_t num_computed = 0;
  int32_t num_reserved = 0;
  int32_t prompt_logits_done = 0;  // wants_prompt_rows(): positions whose rows went out
  bool in_kv = false;    // registered with the KV manager
  bool swapped = false;  // in_kv, with its K/V in the host tier (preempted by swap)
  // Token eviction: tokens whose K/V was dropped by compactions, so the KV
  // manager and the runner count num_computed - kv_evicted cache slots;
  // kv_state_fresh: the next slice tells the runner to start its state afresh.
  int32_t kv_evicted = 0;
  bool kv_state_fresh = false;
  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;

  // Overlapped steps (Engine, ModelRunner::launch). A token the device sampled
  // in a launched step that is not collected yet sits in `tokens` as
  // kPendingToken until it is (at most two: one per launched step);
  // num_computed already counts the launched steps' tokens, the KV manager
  // learns of them when they are collected.
  int32_t pending_tokens = 0;
  int32_t pending_row = -1;     // the last launched step's row that samples the newest pending token
  int32_t steps_in_flight = 0;  // launched steps, not yet collected, that carry this sequence
  // Its last token (max_tokens, or the context) is pending: nothing is left to schedule.
  bool last_token_pending = false;
  // Finished while a launched step carried it: its KV blocks go back when that step is collected.
  bool kv_release_pending = false;
  bool kv_release_aborted = false;

  std::mt19937_64 rng;
  TokenHistory history;
  std::unique_ptr<TextDecoder> decoder;
  StopStringMatcher stop_matcher;
  std::unique_ptr<TokenConstraint> constraint;  // this choice's structured-output state, or null
  std::optional<Clock::time_point> last_token_time;

  // Slots this sequence's computed tokens occupy in the KV cache.
  int32_t num_cached_slots() const { return num_computed - kv_evicted; }
  int32_t num_output_tokens() const { return static_cast<int32_t>(tokens.size()) - prompt_length; }
  // Output tokens the engine has seen (not pending).
  int32_t num_known_output_tokens() const { return num_output_tokens() - pending_tokens; }
  int32_t num_pending() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
};

struct RequestState {
  RequestId id = 0;
  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  std::vector<Sequence*> sequences;  // index = choice index, filled as forks happen
  Clock::time_point arrival_time;
  bool admitted_once = false;   // left the queue (queue-length accounting)
  bool forked = false;          // n > 1 children created
  bool aborted = false;
  int32_t cached_tokens = -1;   // prefix-cache hit on first admission
  runtime::KvCompressionConfig kv_compression;  // resolved: the request's or the engine's
  int32_t completion_tokens = 0;
  int32_t num_finished = 0;
  bool first_token_seen = false;
  RequestTimeline timeline;  // where its time to first token went (request_timeline.h)
};

}  // namespace pagoda::engine
