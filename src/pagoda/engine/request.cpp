#include "pagoda/engine/request.h"

namespace pagoda::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

std::optional<RequestOutput> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return std::nullopt;
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finish_pushed_;
}

void RequestStream::push(RequestOutput output) {
  std::function<void()> listener;
  {
    std::lock_guard lock(mutex_);
    if (finish_pushed_) return;
    finish_pushed_ = output.finished;
    queue_.push_back(std::move(output));
    listener = push_listener_;
  }
  ready_.notify_all();
  if (listener) listener();
}

void RequestStream::set_push_listener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  push_listener_ = std::move(listener);
}

}  // namespace pagoda::engine
