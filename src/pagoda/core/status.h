#pragma once
// Status and StatusOr<T>: how pagoda reports expected failures (bad files, bad
// requests, out of memory) across module boundaries, instead of exceptions.
// Assertions are kept for broken invariants only.
//
// Thread safety: values; safe to copy between threads.

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace pagoda {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller passed something wrong (bad flag, bad request field)
  kNotFound,           // a file, tensor or key that should exist does not
  kOutOfRange,         // an index, offset or length past a bound
  kResourceExhausted,  // out of KV blocks, queue full, memory budget
  kFailedPrecondition, // the call is valid but not in this state
  kUnimplemented,      // a valid input that pagoda does not support (yet)
  kDataLoss,           // a file is truncated or corrupt
  kIoError,            // the OS said no
  kCancelled,          // the request was aborted
  kInternal,           // a bug: an invariant broke
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string to_string() const;

  // Prepends context: "loading model: <old message>".
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }

#define PAGODA_DEFINE_STATUS_FACTORY(fn, code)                                   \
  template <typename... Args>                                                    \
  Status fn(fmt::format_string<Args...> format, Args&&... args) {                \
    return Status(StatusCode::code, fmt::format(format, std::forward<Args>(args)...)); \
  }
PAGODA_DEFINE_STATUS_FACTORY(invalid_argument_error, kInvalidArgument)
PAGODA_DEFINE_STATUS_FACTORY(not_found_error, kNotFound)
PAGODA_DEFINE_STATUS_FACTORY(out_of_range_error, kOutOfRange)
PAGODA_DEFINE_STATUS_FACTORY(resource_exhausted_error, kResourceExhausted)
PAGODA_DEFINE_STATUS_FACTORY(failed_precondition_error, kFailedPrecondition)
PAGODA_DEFINE_STATUS_FACTORY(unimplemented_error, kUnimplemented)
PAGODA_DEFINE_STATUS_FACTORY(data_loss_error, kDataLoss)
PAGODA_DEFINE_STATUS_FACTORY(io_error, kIoError)
PAGODA_DEFINE_STATUS_FACTORY(cancelled_error, kCancelled)
PAGODA_DEFINE_STATUS_FACTORY(internal_error, kInternal)
#undef PAGODA_DEFINE_STATUS_FACTORY

// Either a T or a non-ok Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : value_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(value_).ok() && "StatusOr built from an ok Status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status() : std::get<Status>(value_); }

  T& value() & { assert(ok()); return std::get<T>(value_); }
  const T& value() const& { assert(ok()); return std::get<T>(value_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<Status, T> value_;
};

#define PAGODA_STATUS_CONCAT_INNER(a, b) a##b
#define PAGODA_STATUS_CONCAT(a, b) PAGODA_STATUS_CONCAT_INNER(a, b)

#define PAGODA_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::pagoda::Status pagoda_status_ = (expr); \
    if (!pagoda_status_.ok()) return pagoda_status_; \
  } while (0)

#define PAGODA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// PAGODA_ASSIGN_OR_RETURN(auto x, make_x()); returns the error status if make_x failed.
#define PAGODA_ASSIGN_OR_RETURN(lhs, expr) \
  PAGODA_ASSIGN_OR_RETURN_IMPL(PAGODA_STATUS_CONCAT(pagoda_statusor_, __LINE__), lhs, expr)

}  // namespace pagoda
