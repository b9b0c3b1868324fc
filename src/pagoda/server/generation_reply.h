#pragma once
// A submitted generation as an HTTP reply the front drives without a thread
// waiting on it (http_message.h ReplySource): the engine's pushes wake the
// connection, which pulls whatever deltas are ready. A batched completions
// request is one engine request per prompt, answered as one reply: its
// choices numbered prompt by prompt (ResponseBuilder::number_choices_from),
// its usage summed.
//
//  - whole: nothing is sent until every prompt's generation has finished;
//    then 200 with the completion, or the OpenAI error object with the first
//    failure's status (500 model failure, 503 capacity / shutdown; api_error.h).
//  - streamed: 200 and text/event-stream at once, one event per delta, a
//    failure as an error event, then "data: [DONE]".
// A prompt that fails aborts the others (their ends are still awaited, so
// that on_ended gets the tokens they used). cancel() (the client left)
// aborts every engine request.
// With a FirstTokenFloor (first_token_floor.h) the first delta (streamed) or
// the whole answer is held back until the floor's time.
//
// Thread safety: as ReplySource.

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "pagoda/engine/engine.h"
#include "pagoda/server/first_token_floor.h"
#include "pagoda/server/http_message.h"
#include "pagoda/server/openai_response.h"

namespace pagoda::server {

// One prompt's engine request and the builder of its choices.
struct PromptGeneration {
  std::shared_ptr<engine::RequestStream> stream;
  std::unique_ptr<ResponseBuilder> builder;
};

struct GenerationReplyParts {
  engine::Engine* engine = nullptr;
  std::vector<PromptGeneration> prompts;  // at least one; a batched request's in order
  // Called exactly once: with the usage summed over the prompts when every
  // generation has ended (any reason), or with nullopt when the reply is
  // cancelled (or dropped) first.
  std::function<void(std::optional<engine::Usage>)> on_ended;
  int retry_after_seconds = 1;  // on a 429 inside the reply
  FirstTokenFloor floor;         // inactive: nothing is held back
};

std::shared_ptr<ReplySource> make_whole_generation_reply(GenerationReplyParts parts);
std::shared_ptr<ReplySource> make_streamed_generation_reply(GenerationReplyParts parts, bool include_usage);

// The OpenAI error object as a whole HTTP response (429 carries Retry-After).
HttpResponse api_error_response(const ApiError& error, int retry_after_seconds);

}  // namespace pagoda::server
