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
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/engine/sampler.h"
#include "pagoda/engine/sampling_params.h"

namespace pagoda::engine {

using RequestId = uint64_t;

struct GenerationRequest {
  // Cache namespace: set by the server from the authenticated api key, never
  // from the request body. Requests in different namespaces never share KV.
  std::string tenant_namespace;
  std::vector<int32_t> prompt_tokens;  // >= 1 token
  SamplingParams sampling;
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
};

struct RequestOutput {
  RequestId request_id = 0;
  std::vector<ChoiceDelta> choices;  // only choices that changed
  bool finished = false;             // last delta of the request
  Usage usage;                       // filled on the last delta
  std::string error;                 // non-empty if the engine failed the request
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

  // Engine side.
  void push(RequestOutput output);

 private:
  const RequestId id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> queue_;
  bool finish_pushed_ = false;
};

}  // namespace pagoda::engine
