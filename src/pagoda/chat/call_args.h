#pragma once
// ArgReader: binds a call's positional and keyword arguments to a builtin's parameters the
// way Python does (positionally in order, or by name; duplicates and leftovers are errors),
// so filters and methods read `join(d='', attribute=None)` in one line each.
//
// Thread safety: one reader per call.

#include <optional>
#include <string>
#include <string_view>

#include "pagoda/chat/value.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

class ArgReader {
 public:
  // function_name appears in errors: "filter 'join': unexpected keyword argument 'x'".
  ArgReader(std::string function_name, CallArgs& args) : function_name_(std::move(function_name)), args_(args) {}

  // The next parameter, by position or by keyword; nullopt when not given.
  StatusOr<std::optional<Value>> take(std::string_view name);
  // Same, with a default.
  StatusOr<Value> take_or(std::string_view name, Value default_value);
  // A required parameter.
  StatusOr<Value> take_required(std::string_view name);
  // All remaining positional arguments (for *args parameters).
  std::vector<Value> take_rest();
  // Fails on arguments nothing took.
  Status finish() const;

  const std::string& function_name() const { return function_name_; }

 private:
  std::string function_name_;
  CallArgs& args_;
  size_t next_positional_ = 0;
  std::vector<std::string> taken_keywords_;
};

}  // namespace pagoda::chat
