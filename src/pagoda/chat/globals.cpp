#include "pagoda/chat/globals.h"

#include <ctime>

#include "pagoda/chat/call_args.h"
#include "pagoda/chat/interpreter.h"

namespace pagoda::chat {
namespace {

constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox MAX_RANGE

StatusOr<Value> range(Interpreter& interpreter, CallArgs& args) {
  if (!args.keyword.empty()) return invalid_argument_error("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3) {
    return invalid_argument_error("range expected 1 to 3 arguments, got {}", args.positional.size());
  }
  for (const Value& v : args.positional) {
    if (!v.is_integral()) return invalid_argument_error("'{}' object cannot be interpreted as an integer", type_name(v));
  }
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (args.positional.size() == 1) {
    stop = args.positional[0].as_int();
  } else {
    start = args.positional[0].as_int();
    stop = args.positional[1].as_int();
    if (args.positional.size() == 3) step = args.positional[2].as_int();
  }
  if (step == 0) return invalid_argument_error("range() arg 3 must not be zero");
  const long double count_estimate = (static_cast<long double>(stop) - start) / step;
  if (count_estimate > kMaxRange) {
    return resource_exhausted_error("range() of more than {} items is not allowed (as in Jinja's sandbox)", kMaxRange);
  }
  PAGODA_RETURN_IF_ERROR(interpreter.count_iterations(count_estimate > 0 ? static_cast<uint64_t>(count_estimate) : 0));
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.emplace_back(i);
  return Value::list(std::move(items));
}

// namespace(...) and dict(...): dict(mapping, **kwargs) semantics.
StatusOr<Value> make_dict(CallArgs& args, bool is_namespace, const char* name) {
  auto dict = std::make_shared<Dict>();
  dict->is_namespace = is_namespace;
  if (args.positional.size() > 1) return invalid_argument_error("{} expected at most 1 argument, got {}", name, args.positional.size());
  if (args.positional.size() == 1) {
    const Value& source = args.positional[0];
    if (!source.is_dict()) return invalid_argument_error("{}: the positional argument must be a dict, not {}", name, type_name(source));
    for (const auto& [key, value] : source.as_dict()->entries()) PAGODA_RETURN_IF_ERROR(dict->set_item(key, value));
  }
  for (auto& [key, value] : args.keyword) dict->set(key, value);
  return Value(std::move(dict));
}

StatusOr<Value> raise_exception(Interpreter&, CallArgs& args) {
  std::string message;
  if (!args.positional.empty()) message = to_python_str(args.positional[0]);
  return invalid_argument_error("{}{}", kRaisedByTemplate, message);
}

StatusOr<Value> strftime_now(Interpreter& interpreter, CallArgs& call_args) {
  ArgReader args("strftime_now()", call_args);
  PAGODA_ASSIGN_OR_RETURN(Value format, args.take_required("format"));
  PAGODA_RETURN_IF_ERROR(args.finish());
  if (!format.is_string()) return invalid_argument_error("strftime_now(): format must be str, not {}", type_name(format));
  std::tm now{};
  if (interpreter.options().fixed_now) {
    now = *interpreter.options().fixed_now;
  } else {
    const std::time_t seconds = std::time(nullptr);
    localtime_r(&seconds, &now);
  }
  // strftime returns 0 both for "too small" and for an empty result: a sentinel tells them apart
  const std::string pattern = format.as_string() + "\x01";
  std::string buffer(64 + pattern.size() * 4, '\0');
  for (int attempt = 0; attempt < 8; ++attempt) {
    const size_t written = std::strftime(buffer.data(), buffer.size(), pattern.c_str(), &now);
    if (written > 0) return Value(buffer.substr(0, written - 1));
    buffer.resize(buffer.size() * 4);
  }
  return invalid_argument_error("strftime_now(): the formatted date is too long");
}

}  // namespace

void add_globals(std::unordered_map<std::string, Value>& globals) {
  globals["range"] = Value::callable("range", range);
  globals["namespace"] = Value::callable("namespace", [](Interpreter&, CallArgs& args) {
    return make_dict(args, true, "namespace()");
  });
  globals["dict"] = Value::callable("dict", [](Interpreter&, CallArgs& args) { return make_dict(args, false, "dict()"); });
  globals["raise_exception"] = Value::callable("raise_exception", raise_exception);
  globals["strftime_now"] = Value::callable("strftime_now", strftime_now);
}

}  // namespace pagoda::chat
