#pragma once
// Python methods a template may call on values: str (startswith, split, strip, replace, find,
// join, upper, ...), dict (get, items, keys, values, copy) and list (count, index, copy).
// Mutating methods (list.append, dict.update, ...) resolve to an Undefined that fails when
// called, as in Jinja's immutable sandbox that transformers uses.
//
// Thread safety: pure functions; the callables they return hold their receiver by value.

#include <optional>
#include <string_view>

#include "pagoda/chat/value.h"

namespace pagoda::chat {

// The bound method `receiver.name`, or nullopt when the receiver's type has no such method.
std::optional<Value> find_method(const Value& receiver, std::string_view name);

}  // namespace pagoda::chat
