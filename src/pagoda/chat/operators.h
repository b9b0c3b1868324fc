#pragma once
// Python's operators on template values: + - * / // % ** ~, comparisons, `in`, and
// subscripts/slices, with Python's results and Python's TypeErrors (a template that adds a
// string to a number fails here as it fails in transformers).
//
// Strings index and slice by code point. Results larger than max_bytes (string or list
// repetition, concatenation) fail with kResourceExhausted instead of exhausting memory.
//
// Thread safety: pure functions.

#include <cstddef>
#include <string_view>

#include "pagoda/chat/value.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

// op is one of + - * / // % ** ~.
StatusOr<Value> apply_binary_operator(std::string_view op, const Value& left, const Value& right, size_t max_bytes);
// op is one of == != < <= > >= in "not in".
StatusOr<bool> apply_comparison(std::string_view op, const Value& left, const Value& right);
// Python's `item in container`.
StatusOr<bool> contains(const Value& container, const Value& item);

// Python's x[index] for lists, tuples and strings (negative indexes count from the end);
// nullopt when out of range or not indexable by an int.
std::optional<Value> index_sequence(const Value& sequence, int64_t index);
// Python's x[start:stop:step]; each bound may be None/Undefined (omitted).
StatusOr<Value> slice_sequence(const Value& sequence, const Value& start, const Value& stop, const Value& step);

// Python's printf-style `format % args` for the conversions templates use (s r d i f x X o c
// and %%, with flags - 0 + space, width and precision); args is a tuple for several values.
// Other conversions and %(name)s mappings fail with kUnimplemented.
StatusOr<Value> python_percent_format(const std::string& format, const Value& args, size_t max_bytes);

// Rough bytes a value occupies, to bound what a template builds.
size_t approximate_size(const Value& value);

}  // namespace pagoda::chat
