#include "pagoda/chat/call_args.h"

#include <algorithm>

namespace pagoda::chat {

StatusOr<std::optional<Value>> ArgReader::take(std::string_view name) {
  std::optional<Value> found;
  if (next_positional_ < args_.positional.size()) found = args_.positional[next_positional_++];
  for (const auto& [key, value] : args_.keyword) {
    if (key != name) continue;
    if (found) return invalid_argument_error("{}: got multiple values for argument '{}'", function_name_, name);
    found = value;
    taken_keywords_.emplace_back(name);
  }
  return found;
}

StatusOr<Value> ArgReader::take_or(std::string_view name, Value default_value) {
  PAGODA_ASSIGN_OR_RETURN(std::optional<Value> value, take(name));
  return value ? std::move(*value) : std::move(default_value);
}

StatusOr<Value> ArgReader::take_required(std::string_view name) {
  PAGODA_ASSIGN_OR_RETURN(std::optional<Value> value, take(name));
  if (!value) return invalid_argument_error("{}: missing required argument '{}'", function_name_, name);
  return std::move(*value);
}

std::vector<Value> ArgReader::take_rest() {
  std::vector<Value> rest(args_.positional.begin() + static_cast<long>(std::min(next_positional_, args_.positional.size())),
                          args_.positional.end());
  next_positional_ = args_.positional.size();
  return rest;
}

Status ArgReader::finish() const {
  if (next_positional_ < args_.positional.size()) {
    return invalid_argument_error("{}: takes {} positional argument(s) but {} were given", function_name_,
                                  next_positional_, args_.positional.size());
  }
  for (const auto& [key, value] : args_.keyword) {
    if (std::find(taken_keywords_.begin(), taken_keywords_.end(), key) == taken_keywords_.end()) {
      return invalid_argument_error("{}: unexpected keyword argument '{}'", function_name_, key);
    }
  }
  return ok_status();
}

}  // namespace pagoda::chat
