#pragma once
// The global functions a chat template can call, as transformers provides them: Jinja's
// range (capped at 100,000 items, like the sandbox), namespace and dict, plus transformers'
// raise_exception(message) and strftime_now(format).
//
// raise_exception fails the render with kInvalidArgument and the template's message (that is
// how templates reject conversations they cannot format). strftime_now formats local time, or
// RenderOptions::fixed_now when set.
//
// Thread safety: the table is built per render; the functions are pure.

#include <string>
#include <unordered_map>

#include "pagoda/chat/value.h"

namespace pagoda::chat {

// The text before a raise_exception message in the error, so callers can tell template-raised
// errors from others.
inline constexpr std::string_view kRaisedByTemplate = "the template raised an error: ";

void add_globals(std::unordered_map<std::string, Value>& globals);

}  // namespace pagoda::chat
