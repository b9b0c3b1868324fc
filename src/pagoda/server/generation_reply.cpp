#include "pagoda/server/generation_reply.h"

#include <chrono>
#include <deque>

#include <nlohmann/json.hpp>

#include "pagoda/server/api_error.h"

namespace pagoda::server {

using json = nlohmann::json;

HttpResponse api_error_response(const ApiError& error, int retry_after_seconds) {
  HttpResponse r;
  r.status = error.http_status;
  if (error.http_status == 429) r.headers.emplace_back("Retry-After", std::to_string(retry_after_seconds));
  r.body = error.body();
  return r;
}

namespace {

class GenerationReplyBase : public ReplySource {
 public:
  explicit GenerationReplyBase(GenerationReplyParts parts) : parts_(std::move(parts)) {}
  ~GenerationReplyBase() override {
    if (!ended_) cancel();  // never started, or the connection went away without a word
  }

  void start(std::function<void()> wake) override {
    wake_ = wake;
    parts_.stream->set_push_listener(wake);
    wake();  // deltas pushed before the listener was set
  }
  void cancel() override {
    parts_.stream->set_push_listener(nullptr);
    if (!finished_) parts_.engine->abort(parts_.stream->id());
    end(std::nullopt);
  }

 protected:
  // The next delta to send, if any: with a floor, nothing until its time.
  std::optional<engine::RequestOutput> next_delta() {
    if (parts_.floor.active() && !released_) {
      while (auto out = fetch()) held_.push_back(std::move(*out));
      if (held_.empty()) return std::nullopt;
      // Every delta after admission carries the prompt's cached tokens.
      const bool applies = !parts_.floor.hits_only || held_.front().usage.cached_tokens > 0;
      if (applies && std::chrono::steady_clock::now() < parts_.floor.not_before) {
        if (!wake_scheduled_) {
          wake_scheduled_ = true;
          parts_.floor.timer->wake_at(parts_.floor.not_before, wake_);
        }
        return std::nullopt;
      }
      released_ = true;
    }
    if (!held_.empty()) {
      engine::RequestOutput out = std::move(held_.front());
      held_.pop_front();
      return out;
    }
    return fetch();
  }
  // The next delta already pushed by the engine, if any.
  std::optional<engine::RequestOutput> fetch() {
    if (finished_) return std::nullopt;
    auto out = parts_.stream->next(std::chrono::milliseconds(0));
    if (out && out->finished) {
      finished_ = true;
      parts_.stream->set_push_listener(nullptr);
      end(out->usage);
    }
    return out;
  }
  void end(std::optional<engine::Usage> usage) {
    if (ended_) return;
    ended_ = true;
    if (parts_.on_ended) parts_.on_ended(usage);
  }

  GenerationReplyParts parts_;
  std::function<void()> wake_;
  std::deque<engine::RequestOutput> held_;  // fetched, waiting for the floor
  bool released_ = false;                   // the floor has passed (or does not apply)
  bool wake_scheduled_ = false;
  bool finished_ = false;
  bool ended_ = false;
};

class WholeGenerationReply final : public GenerationReplyBase {
 public:
  using GenerationReplyBase::GenerationReplyBase;

  ReplyPiece pull() override {
    ReplyPiece piece;
    while (auto out = next_delta()) {
      parts_.builder->accumulate(*out);
      if (!out->finished) continue;
      piece.has_head = true;
      piece.done = true;
      if (out->failed()) {
        piece.head = api_error_response(api_error_from_engine_failure(out->failure()), parts_.retry_after_seconds);
      } else if (parts_.builder->any_choice_finished(engine::FinishReason::kAbort)) {
        // An abort this reply did not ask for: never a 200 with a cut-short text.
        piece.head = api_error_response(
            api_error_from_status(failed_precondition_error("the request was aborted before it finished; retry")),
            parts_.retry_after_seconds);
      } else {
        piece.head.status = 200;
        piece.head.body = parts_.builder->final_response(out->usage).dump(-1, ' ', false, json::error_handler_t::replace);
      }
      break;
    }
    return piece;
  }
};

class StreamedGenerationReply final : public GenerationReplyBase {
 public:
  StreamedGenerationReply(GenerationReplyParts parts, bool include_usage)
      : GenerationReplyBase(std::move(parts)), include_usage_(include_usage) {}

  ReplyPiece pull() override {
    ReplyPiece piece;
    if (!head_sent_) {
      head_sent_ = true;
      piece.has_head = true;
      piece.streamed = true;
      piece.head.status = 200;
      piece.head.content_type = "text/event-stream";
      piece.head.headers.emplace_back("Cache-Control", "no-cache");
    }
    while (auto out = next_delta()) {
      for (const json& chunk : parts_.builder->chunks(*out)) {
        json c = chunk;
        if (include_usage_) c["usage"] = nullptr;
        piece.data += ResponseBuilder::sse_event(c);
      }
      if (!out->finished) continue;
      if (out->failed()) piece.data += "data: " + api_error_from_engine_failure(out->failure()).body() + "\n\n";
      if (include_usage_) piece.data += ResponseBuilder::sse_event(parts_.builder->usage_chunk(out->usage));
      piece.data += ResponseBuilder::kSseDone;
      piece.done = true;
      break;
    }
    return piece;
  }

 private:
  bool include_usage_;
  bool head_sent_ = false;
};

}  // namespace

std::shared_ptr<ReplySource> make_whole_generation_reply(GenerationReplyParts parts) {
  return std::make_shared<WholeGenerationReply>(std::move(parts));
}

std::shared_ptr<ReplySource> make_streamed_generation_reply(GenerationReplyParts parts, bool include_usage) {
  return std::make_shared<StreamedGenerationReply>(std::move(parts), include_usage);
}

}  // namespace pagoda::server
