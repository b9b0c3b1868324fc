#pragma once
// Template: a Jinja2 template (the subset chat templates use) parsed once and rendered many
// times, byte-for-byte as Jinja2 renders it inside transformers' apply_chat_template
// (trim_blocks, lstrip_blocks, no trailing newline kept, default Undefined, immutable
// sandbox, transformers' tojson/raise_exception/strftime_now).
//
//   PAGODA_ASSIGN_OR_RETURN(Template t, Template::parse("{{ greeting }}, {{ name }}!"));
//   Dict vars; vars.set("greeting", Value("Hello")); vars.set("name", Value("pagoda"));
//   PAGODA_ASSIGN_OR_RETURN(std::string text, t.render(vars));
//
// Errors name the template line: syntax errors and unknown tags/filters/tests are
// kInvalidArgument from parse(); constructs pagoda does not implement (include, import,
// recursive loops, ...) are kUnimplemented from parse(); runtime errors (undefined values used,
// type errors, raise_exception) are kInvalidArgument from render(); exceeding RenderLimits is
// kResourceExhausted.
//
// Thread safety: immutable after parse(); render() may run concurrently from many threads.

#include <memory>
#include <string>
#include <string_view>

#include "pagoda/chat/ast.h"
#include "pagoda/chat/interpreter.h"
#include "pagoda/chat/value.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

class Template {
 public:
  static StatusOr<Template> parse(std::string_view source);

  StatusOr<std::string> render(const Dict& variables, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const NodeList> nodes) : nodes_(std::move(nodes)) {}
  std::shared_ptr<const NodeList> nodes_;
};

}  // namespace pagoda::chat
