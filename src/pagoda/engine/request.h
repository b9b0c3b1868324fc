#pragma once
// What a caller submits to the engine and what it reads back: a
// GenerationRequest in, a RequestStream of RequestOutput deltas out. Deltas
// carry only what is new since the previous one; the last one has
// `finished == true` and the usage.
//
// Thread safety: RequestStream is safe between the engine thread (push) and
// one consumer thread (next); everything else is plain data.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/engine/sampler.h"
#include "pagoda/engine/sampling_params.h"
#include "pagoda/engine/token_constraint.h"
#include "pagoda/runtime/kv_compression.h"

namespace pagoda::engine {

using RequestId = uint64_t;

struct GenerationRequest {
  // Cache namespace: set by the server from the authenticated api key, never
  // from the request body. Requests in different namespaces never share KV.
  std::string tenant_namespace;
  std::vector<int32_t> prompt_tokens;  // >= 1 token
  SamplingParams sampling;
  // Structured outputs: which tokens may come next, in its initial state (each choice samples
  // through its own clone, on the host). nullptr: unconstrained.
  std::shared_ptr<const TokenConstraint> constraint;
  // The quality harness (eval/): logits of every prompt position
  // (RequestOutput::prompt_logits; such a request does not read the prefix
  // cache), and of every generated position (ChoiceDelta::logits).
  // Both take the host path: the logits cross to the host. With
  // return_prompt_logits, sampling.max_tokens may be 0: the request ends
  // (finish "length") once its prompt is computed.
  bool return_prompt_logits = false;
  bool return_logits = false;
  // Whether every computed prompt position gets a logits row: the harness's return_prompt_logits
  // or sampling.prompt_logprobs (reduced by the engine to RequestOutput::prompt_logprobs).
  bool wants_prompt_rows() const { return return_prompt_logits || sampling.prompt_logprobs.has_value(); }
  // Token eviction for this request (runtime/kv_compression.h); nullopt: the
  // engine's default (EngineConfig::kv_compression). Needs n == 1 and a
  // runner that compacts KV (RunnerCapabilities::compacts_kv).
  std::optional<runtime::KvCompressionConfig> kv_compression;
  // Scheduling priority (vLLM's): lower values are admitted first and preempted last; requests of one
  // priority go first come, first served (scheduler.h). 0 for all: plain FCFS.
  int32_t priority = 0;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error", or ""

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // over all choices
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache (first admission)
};

// What one choice gained since the last delta.
struct ChoiceDelta {
  int32_t index = 0;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<SampledToken> logprobs;  // one per token when logprobs were requested
  FinishReason finish_reason = FinishReason::kNone;
  // The eos or stop token id that ended the choice (not part of `tokens` or
  // the text), with its logprobs when requested; nullopt otherwise.
  std::optional<SampledToken> stop_token;
  // return_logits: the vocab-size logits row each token (stop token last) was
  // drawn from, concatenated.
  std::vector<float> logits;
};

// A request the engine failed after submit() ends with a finished delta whose
// error_code says why; callers decide on the code, never on the text (error is
// for people and may be reworded). The codes the engine sets:
//   kFailedPrecondition  the request can never fit in this engine's KV cache:
//                        with nothing else running, its tokens still need more
//                        blocks than the cache can make free. Retrying on the
//                        same server fails the same way (HTTP 503
//                        "kv_cache_capacity"). Not kResourceExhausted: that
//                        code means a passing shortage (submit()'s full queue,
//                        429, retry soon).
//   kInternal            the model step failed (the runner's error, or output
//                        of the wrong shape); every request in that step fails.
//   (both end their choices with FinishReason::kError)
//   kCancelled           the engine shut down before the request finished
//                        (choices end with FinishReason::kAbort).
// A caller's own abort() is not a failure: its choices end with kAbort and
// error_code stays kOk. The code sits beside the text (rather than one Status)
// so readers that only test `error.empty()` keep working.
struct RequestOutput {
  RequestId request_id = 0;
  std::vector<ChoiceDelta> choices;  // only choices that changed
  bool finished = false;             // last delta of the request
  Usage usage;                       // filled on the last delta; cached_tokens on every delta
                                     // after admission (the server's TTFT floor reads it)
  // return_prompt_logits: vocab-size rows for the prompt positions computed in
  // this delta's steps, in order; row i predicts the token after position i.
  std::vector<float> prompt_logits;
  // sampling.prompt_logprobs: prompt tokens 1, 2, .. scored (engine::score_token) in order, those
  // whose predicting position was computed in this delta's steps; the first prompt token has none.
  std::vector<SampledToken> prompt_logprobs;
  StatusCode error_code = StatusCode::kOk;  // kOk unless the engine failed the request (see above)
  std::string error;                        // the failure in words; non-empty exactly when error_code != kOk

  bool failed() const { return error_code != StatusCode::kOk; }
  // The failure as a Status (ok when the request did not fail).
  Status failure() const { return failed() ? Status(error_code, error) : Status(); }
};

// Per-request queue of deltas from the engine thread to the consumer.
class RequestStream {
 public:
  explicit RequestStream(RequestId id) : id_(id) {}
  RequestId id() const { return id_; }

  // Waits up to `timeout` for the next delta; nullopt on timeout or after the
  // finished delta was read.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  bool finished() const;
  // For a consumer that does not block in next() (an event loop): `listener`
  // is called after every later push, on the pushing thread, outside the
  // stream's lock; it should only schedule a next(0) elsewhere. Replaces any
  // earlier listener; deltas pushed before it was set are already queued.
  void set_push_listener(std::function<void()> listener);

  // Engine side.
  void push(RequestOutput output);

 private:
  const RequestId id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> queue_;
  bool finish_pushed_ = false;
  std::function<void()> push_listener_;
};

}  // namespace pagoda::engine
