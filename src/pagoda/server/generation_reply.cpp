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

engine::Usage& operator+=(engine::Usage& sum, const engine::Usage& u) {
  sum.prompt_tokens += u.prompt_tokens;
  sum.completion_tokens += u.completion_tokens;
  sum.cached_tokens += u.cached_tokens;
  return sum;
}

// A delta and the prompt (index into GenerationReplyParts::prompts) it belongs to.
struct PromptDelta {
  size_t prompt = 0;
  engine::RequestOutput out;
};

class GenerationReplyBase : public ReplySource {
 public:
  explicit GenerationReplyBase(GenerationReplyParts parts)
      : parts_(std::move(parts)), finished_(parts_.prompts.size(), false) {}
  ~GenerationReplyBase() override {
    if (!ended_) cancel();  // never started, or the connection went away without a word
  }

  void start(std::function<void()> wake) override {
    wake_ = wake;
    for (PromptGeneration& p : parts_.prompts) p.stream->set_push_listener(wake);
    wake();  // deltas pushed before the listener was set
  }
  void cancel() override {
    for (PromptGeneration& p : parts_.prompts) p.stream->set_push_listener(nullptr);
    abort_unfinished();
    end(std::nullopt);
  }

 protected:
  // The next delta to send, if any: with a floor, nothing until its time.
  std::optional<PromptDelta> next_delta() {
    if (parts_.floor.active() && !released_) {
      while (auto d = fetch()) held_.push_back(std::move(*d));
      if (held_.empty()) return std::nullopt;
      // Every delta after admission carries the prompt's cached tokens. A batch is held back
      // whatever its first delta says: another of its prompts may be the one that hit.
      const bool applies = !parts_.floor.hits_only || parts_.prompts.size() > 1 ||
                           held_.front().out.usage.cached_tokens > 0;
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
      PromptDelta d = std::move(held_.front());
      held_.pop_front();
      return d;
    }
    return fetch();
  }
  // The next delta already pushed by the engine for some prompt, if any (the
  // prompts taken in turn, so that none waits behind another's backlog).
  std::optional<PromptDelta> fetch() {
    const size_t n = parts_.prompts.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (next_poll_ + k) % n;
      if (finished_[i]) continue;
      auto out = parts_.prompts[i].stream->next(std::chrono::milliseconds(0));
      if (!out) continue;
      next_poll_ = i + 1;
      if (out->finished) {
        finished_[i] = true;
        ++finished_count_;
        usage_ += out->usage;
        parts_.prompts[i].stream->set_push_listener(nullptr);
        // One prompt's failure fails the reply: the others stop early.
        if (out->failed() && !failure_) {
          failure_ = out->failure();
          abort_unfinished();
        }
        if (all_finished()) end(usage_);
      }
      return PromptDelta{i, std::move(*out)};
    }
    return std::nullopt;
  }
  bool all_finished() const { return finished_count_ == parts_.prompts.size(); }
  // Every prompt's last delta has been fetched and none is held back: the reply can end.
  bool all_delivered() const { return all_finished() && held_.empty(); }
  void abort_unfinished() {
    for (size_t i = 0; i < parts_.prompts.size(); ++i)
      if (!finished_[i]) parts_.engine->abort(parts_.prompts[i].stream->id());
  }
  void end(std::optional<engine::Usage> usage) {
    if (ended_) return;
    ended_ = true;
    if (parts_.on_ended) parts_.on_ended(usage);
  }
  ResponseBuilder& builder(size_t prompt) { return *parts_.prompts[prompt].builder; }

  GenerationReplyParts parts_;
  std::function<void()> wake_;
  std::deque<PromptDelta> held_;  // fetched, waiting for the floor
  bool released_ = false;         // the floor has passed (or does not apply)
  bool wake_scheduled_ = false;
  std::vector<bool> finished_;    // per prompt: its last delta was fetched
  size_t finished_count_ = 0;
  size_t next_poll_ = 0;
  engine::Usage usage_;           // summed over the finished prompts
  std::optional<Status> failure_;  // the first prompt's failure
  bool ended_ = false;
};

class WholeGenerationReply final : public GenerationReplyBase {
 public:
  using GenerationReplyBase::GenerationReplyBase;

  ReplyPiece pull() override {
    ReplyPiece piece;
    while (auto d = next_delta()) {
      builder(d->prompt).accumulate(d->out);
      if (!all_delivered()) continue;
      piece.has_head = true;
      piece.done = true;
      piece.head = whole_response();
      break;
    }
    return piece;
  }

 private:
  HttpResponse whole_response() const {
    if (failure_) return api_error_response(api_error_from_engine_failure(*failure_), parts_.retry_after_seconds);
    for (const PromptGeneration& p : parts_.prompts) {
      // An abort this reply did not ask for: never a 200 with a cut-short text.
      if (p.builder->any_choice_finished(engine::FinishReason::kAbort))
        return api_error_response(
            api_error_from_status(failed_precondition_error("the request was aborted before it finished; retry")),
            parts_.retry_after_seconds);
    }
    json body = parts_.prompts[0].builder->final_response(usage_);
    for (size_t i = 1; i < parts_.prompts.size(); ++i) {
      json more = parts_.prompts[i].builder->final_response(usage_);
      for (json& choice : more["choices"]) body["choices"].push_back(std::move(choice));
    }
    HttpResponse r;
    r.status = 200;
    r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
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
    while (auto d = next_delta()) {
      // After a failure the other prompts' last chunks (aborted) are not sent.
      if (!error_sent_) {
        for (const json& chunk : builder(d->prompt).chunks(d->out)) {
          json c = chunk;
          if (include_usage_) c["usage"] = nullptr;
          piece.data += ResponseBuilder::sse_event(c);
        }
      }
      if (d->out.failed() && !error_sent_) {
        error_sent_ = true;
        piece.data += "data: " + api_error_from_engine_failure(d->out.failure()).body() + "\n\n";
      }
      if (!all_delivered()) continue;
      if (include_usage_) piece.data += ResponseBuilder::sse_event(builder(0).usage_chunk(usage_));
      piece.data += ResponseBuilder::kSseDone;
      piece.done = true;
      break;
    }
    return piece;
  }

 private:
  bool include_usage_;
  bool head_sent_ = false;
  bool error_sent_ = false;
};

}  // namespace

std::shared_ptr<ReplySource> make_whole_generation_reply(GenerationReplyParts parts) {
  return std::make_shared<WholeGenerationReply>(std::move(parts));
}

std::shared_ptr<ReplySource> make_streamed_generation_reply(GenerationReplyParts parts, bool include_usage) {
  return std::make_shared<StreamedGenerationReply>(std::move(parts), include_usage);
}

}  // namespace pagoda::server
