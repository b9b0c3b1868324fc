#pragma once
// json.dumps exactly as Python writes it, for the `tojson` filter: transformers replaces Jinja's
// HTML-escaping tojson with json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), and prompts embed the result (tool schemas, tool-call arguments), so the
// bytes must match: ", " and ": " separators, "," with an indent, Python float repr,
// NaN/Infinity, non-ASCII kept unless ensure_ascii.
//
// Thread safety: pure function.

#include <optional>
#include <string>

#include "pagoda/chat/value.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

struct PythonJsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line; else the text of one indent level
  std::optional<std::string> item_separator;  // default ", " (or "," with an indent)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
};

// Fails like Python on values JSON cannot hold ("Object of type Undefined is not JSON
// serializable") and on nesting deeper than 512 levels (a namespace that contains itself).
StatusOr<std::string> python_json_dumps(const Value& value, const PythonJsonOptions& options);

}  // namespace pagoda::chat
