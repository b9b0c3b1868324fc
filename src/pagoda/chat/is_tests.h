#pragma once
// Jinja's builtin tests, the `x is <test>` predicates (defined, undefined, none, true, false,
// boolean, integer, float, number, string, mapping, iterable, sequence, callable, sameas,
// eq/equalto/==, ne/!=, lt/</lessthan, le/<=, gt/>/greaterthan, ge/>=, in, odd, even,
// divisibleby, lower, upper, escaped, filter, test), as Jinja 3.1 defines them (bool is not
// an integer; Undefined is iterable; dict is a sequence).
//
// Thread safety: pure functions.

#include <string_view>

#include "pagoda/chat/ast.h"

namespace pagoda::chat {

// nullptr for a test pagoda does not implement.
TestFunction find_test(std::string_view name);

}  // namespace pagoda::chat
