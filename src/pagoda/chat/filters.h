#pragma once
// Jinja's builtin filters that chat templates use, with Jinja 3.1's arguments and results
// (abs, attr, capitalize, count, default/d, dictsort, escape/e, first, float, format, indent, int,
// items, join, last, length, list, lower, map, max, min, reject, rejectattr, replace, reverse,
// round, safe, select, selectattr, sort, string, sum, title, trim, unique, upper), plus
// transformers' tojson (json.dumps with ensure_ascii=False: no HTML escaping).
//
// map/select/reverse return lists where Jinja returns generators: identical once joined,
// iterated or passed through |list, which is how templates consume them.
//
// Thread safety: pure functions.

#include <string_view>

#include "pagoda/chat/ast.h"

namespace pagoda::chat {

// nullptr for a filter pagoda does not implement.
FilterFunction find_filter(std::string_view name);

}  // namespace pagoda::chat
