#pragma once
// Interpreter: walks a parsed template and writes its output, with Jinja2's semantics as
// transformers configures them (default Undefined, immutable sandbox, no autoescape):
//  - scopes: each for-loop iteration, macro call and with-block has its own scope; `set`
//    inside them does not leak out (use namespace()); if-blocks share the enclosing scope;
//  - attribute access `a.b` tries Python attributes (str/dict/list methods) before keys, item
//    access `a[b]` keys before attributes; misses give Undefined, and using an Undefined in
//    arithmetic, comparison, calls or attribute access is an error naming it;
//  - errors carry the template line.
//
// Bounds (RenderLimits) make hostile templates fail fast instead of hanging or crashing:
// total loop iterations and macro calls, macro call depth, output and value size, the bytes
// of work a render does (what it builds, scans and writes), and how deep values nest.
//
// Thread safety: one Interpreter per render; it only reads the syntax tree.

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagoda/chat/ast.h"
#include "pagoda/chat/value.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;      // the prompt, and any one string or list built
  uint64_t max_loop_iterations = 1000000;   // for-loop iterations and macro calls over the whole render
  int max_call_depth = 48;                  // nested macro calls (recursion)
  // Bytes of strings and lists the render builds, scans (operands of operators, subjects and
  // arguments of filters and calls, iterated sequences) and writes, plus 128 a container (the
  // render holds every container it made until it ends), summed over the whole render: one
  // value is capped by max_output_bytes, but a loop could rebuild it a million times. Real
  // templates touch each message a few times; this is 4 x the output cap.
  uint64_t max_work_bytes = 256u << 20;
};

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() formats: local time now unless pinned (tests pin it).
  std::optional<std::tm> fixed_now;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  // Renders the template with `variables` (messages, add_generation_prompt, bos_token, ...)
  // visible on top of the globals (range, namespace, dict, raise_exception, strftime_now).
  Status render(const NodeList& nodes, const Dict& variables, std::string& out);

  // ---- services for filters, tests, methods and globals ----
  StatusOr<Value> call(const Value& callee, CallArgs& args);
  StatusOr<Value> get_attribute(const Value& object, const std::string& name);
  StatusOr<Value> get_item(const Value& object, const Value& key);
  StatusOr<Value> apply_filter(std::string_view name, const Value& subject, CallArgs& args);
  StatusOr<bool> apply_test(std::string_view name, const Value& subject, CallArgs& args);
  // Counts n loop iterations (or equivalent work) against the limit.
  Status count_iterations(uint64_t n);
  // Counts bytes of work against RenderLimits::max_work_bytes (the render's WorkMeter).
  Status charge(uint64_t bytes);
  // Fails when a value of this many bytes is over the size limit.
  Status check_size(size_t bytes) const;
  const RenderOptions& options() const { return options_; }

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow { kNormal, kBreak, kContinue };

  Status render_nodes(const NodeList& nodes);
  Status render_node(const Node& node);
  Status render_for(const Node& node);
  Status render_set(const Node& node);
  Status render_macro_definition(const Node& node);
  StatusOr<Value> call_macro(const Node& macro, CallArgs& args);
  Status write(std::string_view text);
  // Renders nodes into a string instead of the output.
  StatusOr<std::string> capture(const NodeList& nodes);

  // evaluate(), then the meter checked, and a value the expression built charged and its
  // nesting checked.
  StatusOr<Value> eval(const Expr& expr);
  StatusOr<Value> evaluate(const Expr& expr);
  Status account(const Expr& expr, const Value& result);
  // eval, with "line N: " put in front of an error that has no line yet.
  StatusOr<Value> eval_at(const Expr& expr, int line);
  StatusOr<Value> eval_compare(const Expr& expr);
  StatusOr<CallArgs> eval_args(const Expr& expr, size_t first_positional);
  StatusOr<Value> loop_attribute(const std::shared_ptr<LoopState>& loop, const std::string& name);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value value);
  Status assign_targets(const std::vector<std::string>& targets, const Value& value, int line);

  const RenderOptions& options_;
  Frame globals_;
  std::vector<Frame> frames_;  // [0]: the render's variables and top-level sets; then scopes
  size_t floor_ = 1;           // scopes below this (other than [0]) are hidden: a macro's caller
  std::string* out_ = nullptr;
  Flow flow_ = Flow::kNormal;
  uint64_t iterations_ = 0;
  int call_depth_ = 0;
};

// Prefixes "line N: " unless the message already starts with "line ".
Status at_line(Status status, int line);

}  // namespace pagoda::chat
