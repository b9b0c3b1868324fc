#include "pagoda/chat/interpreter.h"

#include <limits>

#include "pagoda/chat/filters.h"
#include "pagoda/chat/globals.h"
#include "pagoda/chat/is_tests.h"
#include "pagoda/chat/methods.h"
#include "pagoda/chat/operators.h"

namespace pagoda::chat {

Status at_line(Status status, int line) {
  if (status.ok() || status.message().rfind("line ", 0) == 0) return status;
  return Status(status.code(), fmt::format("line {}: {}", line, status.message()));
}

Interpreter::Interpreter(const RenderOptions& options) : options_(options) { add_globals(globals_); }

Status Interpreter::render(const NodeList& nodes, const Dict& variables, std::string& out) {
  frames_.assign(1, Frame{});
  for (const auto& [key, value] : variables.entries()) {
    if (key.is_string()) frames_[0][key.as_string()] = value;
  }
  floor_ = 1;
  out_ = &out;
  flow_ = Flow::kNormal;
  iterations_ = 0;
  call_depth_ = 0;
  WorkMeter meter(options_.limits.max_work_bytes);
  Status status = render_nodes(nodes);
  if (WorkMeter::exhausted()) return WorkMeter::exhausted_error();  // whatever failed after, failed on partial values
  return status;
}

// ---- scopes ----

Value Interpreter::lookup(const std::string& name) const {
  for (size_t i = frames_.size(); i-- > floor_;) {
    const auto it = frames_[i].find(name);
    if (it != frames_[i].end()) return it->second;
  }
  if (const auto it = frames_[0].find(name); it != frames_[0].end()) return it->second;
  if (const auto it = globals_.find(name); it != globals_.end()) return it->second;
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const std::string& name, Value value) { frames_.back()[name] = std::move(value); }

Status Interpreter::assign_targets(const std::vector<std::string>& targets, const Value& value, int line) {
  if (targets.size() == 1) {
    assign(targets[0], value);
    return ok_status();
  }
  auto items = iterate(value);
  if (WorkMeter::exhausted()) return WorkMeter::exhausted_error();
  if (!items.ok()) return at_line(invalid_argument_error("cannot unpack non-iterable {} object", type_name(value)), line);
  if (items->size() != targets.size()) {
    return invalid_argument_error("line {}: {} values to unpack (expected {}, got {})", line,
                                  items->size() > targets.size() ? "too many" : "not enough", targets.size(),
                                  items->size());
  }
  for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], (*items)[i]);
  return ok_status();
}

// ---- statements ----

Status Interpreter::write(std::string_view text) {
  if (out_->size() + text.size() > options_.limits.max_output_bytes) {
    return resource_exhausted_error("the rendered template would exceed the output limit of {} bytes",
                                    options_.limits.max_output_bytes);
  }
  PAGODA_RETURN_IF_ERROR(charge(text.size()));
  out_->append(text);
  return ok_status();
}

StatusOr<std::string> Interpreter::capture(const NodeList& nodes) {
  std::string captured;
  std::string* saved = out_;
  out_ = &captured;
  Status status = render_nodes(nodes);
  out_ = saved;
  if (!status.ok()) return status;
  return captured;
}

Status Interpreter::render_nodes(const NodeList& nodes) {
  for (const auto& node : nodes) {
    PAGODA_RETURN_IF_ERROR(render_node(*node));
    if (flow_ != Flow::kNormal) return ok_status();
  }
  return ok_status();
}

Status Interpreter::render_node(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kText:
      return write(node.text);
    case Node::Kind::kOutput: {
      PAGODA_ASSIGN_OR_RETURN(Value value, eval_at(*node.expr, node.line));
      if (value.is_string()) return write(value.as_string());
      return write(to_python_str(value));
    }
    case Node::Kind::kIf:
      for (const auto& [condition, body] : node.branches) {
        PAGODA_ASSIGN_OR_RETURN(Value test, eval_at(*condition, condition->line));
        if (is_truthy(test)) return render_nodes(body);
      }
      return render_nodes(node.else_body);
    case Node::Kind::kFor:
      return render_for(node);
    case Node::Kind::kSet:
    case Node::Kind::kSetBlock:
      return render_set(node);
    case Node::Kind::kMacro:
      return render_macro_definition(node);
    case Node::Kind::kFilterBlock: {
      PAGODA_ASSIGN_OR_RETURN(std::string text, capture(node.body));
      Value value(std::move(text));
      for (const auto& filter : node.filters) {
        PAGODA_ASSIGN_OR_RETURN(CallArgs args, eval_args(*filter, 1));
        auto filtered = filter->filter(*this, value, args);
        if (!filtered.ok()) return at_line(filtered.status(), filter->line);
        value = std::move(filtered).value();
      }
      return write(to_python_str(value));
    }
    case Node::Kind::kWith: {
      Frame frame;
      for (const auto& [name, expr] : node.params) {
        PAGODA_ASSIGN_OR_RETURN(Value value, eval_at(*expr, node.line));
        frame[name] = std::move(value);
      }
      frames_.push_back(std::move(frame));
      Status status = render_nodes(node.body);
      frames_.pop_back();
      return status;
    }
    case Node::Kind::kBreak:
      flow_ = Flow::kBreak;
      return ok_status();
    case Node::Kind::kContinue:
      flow_ = Flow::kContinue;
      return ok_status();
    case Node::Kind::kGeneration:
      return render_nodes(node.body);
  }
  return internal_error("line {}: unknown statement", node.line);
}

Status Interpreter::render_for(const Node& node) {
  PAGODA_ASSIGN_OR_RETURN(Value iterable, eval_at(*node.expr, node.line));
  auto items = iterate(iterable);
  if (!items.ok()) return at_line(items.status(), node.line);

  auto loop = std::make_shared<LoopState>();
  auto kept = std::make_shared<List>();
  if (node.filter_expr) {  // `for x in xs if cond`: loop.* counts only the kept items
    for (Value& item : *items) {
      PAGODA_RETURN_IF_ERROR(count_iterations(1));
      frames_.emplace_back();
      Status status = assign_targets(node.targets, item, node.line);
      StatusOr<Value> keep = status.ok() ? eval_at(*node.filter_expr, node.line) : StatusOr<Value>(status);
      frames_.pop_back();
      if (!keep.ok()) return keep.status();
      if (is_truthy(*keep)) kept->items.push_back(std::move(item));
    }
  } else {
    kept->items = std::move(items).value();
  }
  loop->items = kept;

  if (kept->items.empty()) {
    frames_.emplace_back();
    Status status = render_nodes(node.else_body);
    frames_.pop_back();
    return status;
  }
  for (size_t i = 0; i < kept->items.size(); ++i) {
    PAGODA_RETURN_IF_ERROR(count_iterations(1));
    loop->index0 = i;
    frames_.emplace_back();
    Status status = assign_targets(node.targets, kept->items[i], node.line);
    if (status.ok()) {
      frames_.back()["loop"] = Value(loop);
      status = render_nodes(node.body);
    }
    frames_.pop_back();
    PAGODA_RETURN_IF_ERROR(status);
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return ok_status();
}

Status Interpreter::render_set(const Node& node) {
  if (node.kind == Node::Kind::kSetBlock) {
    PAGODA_ASSIGN_OR_RETURN(std::string text, capture(node.body));
    assign(node.targets[0], Value(std::move(text)));
    return ok_status();
  }
  PAGODA_ASSIGN_OR_RETURN(Value value, eval_at(*node.expr, node.line));
  if (!node.namespace_name.empty()) {
    const Value target = lookup(node.namespace_name);
    if (!target.is_dict() || !target.as_dict()->is_namespace) {
      return invalid_argument_error("line {}: cannot assign attribute '{}' on '{}': it is a {}, not a namespace()",
                                    node.line, node.attribute, node.namespace_name, type_name(target));
    }
    target.as_dict()->set(node.attribute, std::move(value));
    return ok_status();
  }
  return assign_targets(node.targets, value, node.line);
}

Status Interpreter::render_macro_definition(const Node& node) {
  const Node* macro = &node;
  assign(node.name, Value::callable("macro '" + node.name + "'", [macro](Interpreter& interpreter, CallArgs& args) {
           return interpreter.call_macro(*macro, args);
         }));
  return ok_status();
}

StatusOr<Value> Interpreter::call_macro(const Node& macro, CallArgs& args) {
  if (call_depth_ >= options_.limits.max_call_depth) {
    return resource_exhausted_error("line {}: macro '{}' nested deeper than {} calls (runaway recursion?)", macro.line,
                                    macro.name, options_.limits.max_call_depth);
  }
  // A macro that calls itself twice is exponential within the depth limit: calls count as steps.
  PAGODA_RETURN_IF_ERROR(at_line(count_iterations(1), macro.line));
  if (args.positional.size() > macro.params.size()) {
    return invalid_argument_error("macro '{}' takes not more than {} argument(s)", macro.name, macro.params.size());
  }
  Frame frame;
  for (size_t i = 0; i < args.positional.size(); ++i) frame[macro.params[i].first] = args.positional[i];
  for (auto& [key, value] : args.keyword) {
    bool known = false;
    for (const auto& param : macro.params) known |= param.first == key;
    if (!known) return invalid_argument_error("macro '{}' takes no keyword argument '{}'", macro.name, key);
    if (frame.count(key) != 0) return invalid_argument_error("macro '{}' got multiple values for argument '{}'", macro.name, key);
    frame[key] = value;
  }

  const size_t saved_floor = floor_;
  frames_.push_back(std::move(frame));
  floor_ = frames_.size() - 1;  // the caller's scopes are not visible inside the macro
  ++call_depth_;
  Status status;
  for (const auto& [name, default_value] : macro.params) {  // missing arguments: default or undefined
    if (frames_.back().count(name) != 0) continue;
    if (default_value) {
      auto value = eval_at(*default_value, macro.line);
      if (!value.ok()) {
        status = value.status();
        break;
      }
      frames_.back()[name] = std::move(value).value();
    } else {
      frames_.back()[name] = Value::undefined("'" + name + "' is undefined (macro '" + macro.name + "' was called without it)");
    }
  }
  StatusOr<std::string> text = status.ok() ? capture(macro.body) : StatusOr<std::string>(status);
  --call_depth_;
  frames_.pop_back();
  floor_ = saved_floor;
  if (!text.ok()) return text.status();
  return Value(std::move(text).value());
}

// ---- expressions ----

StatusOr<Value> Interpreter::eval_at(const Expr& expr, int line) {
  auto value = eval(expr);
  if (!value.ok()) return at_line(value.status(), line);
  return value;
}

StatusOr<CallArgs> Interpreter::eval_args(const Expr& expr, size_t first_positional) {
  CallArgs args;
  for (size_t i = first_positional; i < expr.children.size(); ++i) {
    PAGODA_ASSIGN_OR_RETURN(Value value, eval(*expr.children[i]));
    PAGODA_RETURN_IF_ERROR(charge(approximate_size(value)));
    args.positional.push_back(std::move(value));
  }
  for (const auto& [key, value_expr] : expr.keyword_args) {
    PAGODA_ASSIGN_OR_RETURN(Value value, eval(*value_expr));
    PAGODA_RETURN_IF_ERROR(charge(approximate_size(value)));
    args.keyword.emplace_back(key, std::move(value));
  }
  return args;
}

StatusOr<Value> Interpreter::eval(const Expr& expr) {
  PAGODA_ASSIGN_OR_RETURN(Value value, evaluate(expr));
  PAGODA_RETURN_IF_ERROR(account(expr, value));
  return value;
}

Status Interpreter::account(const Expr& expr, const Value& result) {
  if (WorkMeter::exhausted()) return WorkMeter::exhausted_error();  // the value may be partial
  switch (expr.kind) {
    case Expr::Kind::kList:
    case Expr::Kind::kTuple:
    case Expr::Kind::kDict:
    case Expr::Kind::kSlice:
    case Expr::Kind::kCall:
    case Expr::Kind::kFilter:
    case Expr::Kind::kBinary:
      break;  // these build values
    default:
      return ok_status();  // these pass on a value that exists already
  }
  PAGODA_RETURN_IF_ERROR(charge(approximate_size(result)));
  if (nesting_depth(result) > kMaxValueDepth) {
    return resource_exhausted_error("a template value would nest deeper than {} levels", kMaxValueDepth);
  }
  return ok_status();
}

StatusOr<Value> Interpreter::evaluate(const Expr& expr) {
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName:
      return lookup(expr.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(expr.children.size());
      for (const auto& child : expr.children) {
        PAGODA_ASSIGN_OR_RETURN(Value item, eval(*child));
        items.push_back(std::move(item));
      }
      return expr.kind == Expr::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case Expr::Kind::kDict: {
      auto dict = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
        PAGODA_ASSIGN_OR_RETURN(Value key, eval(*expr.children[i]));
        PAGODA_ASSIGN_OR_RETURN(Value value, eval(*expr.children[i + 1]));
        PAGODA_RETURN_IF_ERROR(dict->set_item(std::move(key), std::move(value)));
      }
      return Value(std::move(dict));
    }
    case Expr::Kind::kAttribute: {
      PAGODA_ASSIGN_OR_RETURN(Value object, eval(*expr.children[0]));
      if (object.is_string()) PAGODA_RETURN_IF_ERROR(charge(object.as_string().size()));  // its methods scan it
      return get_attribute(object, expr.name);
    }
    case Expr::Kind::kItem: {
      PAGODA_ASSIGN_OR_RETURN(Value object, eval(*expr.children[0]));
      PAGODA_ASSIGN_OR_RETURN(Value key, eval(*expr.children[1]));
      return get_item(object, key);
    }
    case Expr::Kind::kSlice: {
      PAGODA_ASSIGN_OR_RETURN(Value object, eval(*expr.children[0]));
      Value bounds[3];
      for (size_t i = 0; i < 3; ++i) {
        if (expr.children[i + 1]) {
          PAGODA_ASSIGN_OR_RETURN(bounds[i], eval(*expr.children[i + 1]));
        }
      }
      return slice_sequence(object, bounds[0], bounds[1], bounds[2]);
    }
    case Expr::Kind::kCall: {
      PAGODA_ASSIGN_OR_RETURN(Value callee, eval(*expr.children[0]));
      PAGODA_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr, 1));
      return call(callee, args);
    }
    case Expr::Kind::kFilter: {
      PAGODA_ASSIGN_OR_RETURN(Value subject, eval(*expr.children[0]));
      PAGODA_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr, 1));
      PAGODA_RETURN_IF_ERROR(charge(approximate_size(subject)));
      auto result = expr.filter(*this, subject, args);
      if (!result.ok()) return Status(result.status().code(), fmt::format("filter '{}': {}", expr.name, result.status().message()));
      return result;
    }
    case Expr::Kind::kTest: {
      PAGODA_ASSIGN_OR_RETURN(Value subject, eval(*expr.children[0]));
      PAGODA_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr, 1));
      PAGODA_RETURN_IF_ERROR(charge(approximate_size(subject)));
      auto result = expr.test(*this, subject, args);
      if (!result.ok()) return Status(result.status().code(), fmt::format("test '{}': {}", expr.name, result.status().message()));
      return Value(*result != expr.negated);
    }
    case Expr::Kind::kUnary: {
      PAGODA_ASSIGN_OR_RETURN(Value operand, eval(*expr.children[0]));
      if (expr.name == "not") return Value(!is_truthy(operand));
      if (operand.is_undefined()) return invalid_argument_error("{}", operand.undefined_hint());
      if (!operand.is_number()) {
        return invalid_argument_error("bad operand type for unary {}: '{}'", expr.name, type_name(operand));
      }
      if (expr.name == "+") return operand.is_bool() ? Value(operand.as_int()) : operand;
      if (operand.is_float()) return Value(-operand.as_double());
      if (operand.as_int() == std::numeric_limits<int64_t>::min()) return out_of_range_error("integer overflow");
      return Value(-operand.as_int());
    }
    case Expr::Kind::kBinary: {
      PAGODA_ASSIGN_OR_RETURN(Value left, eval(*expr.children[0]));
      PAGODA_ASSIGN_OR_RETURN(Value right, eval(*expr.children[1]));
      PAGODA_RETURN_IF_ERROR(charge(approximate_size(left) + approximate_size(right)));
      return apply_binary_operator(expr.name, left, right, options_.limits.max_output_bytes);
    }
    case Expr::Kind::kAnd: {  // Python returns the deciding operand, not a bool
      PAGODA_ASSIGN_OR_RETURN(Value left, eval(*expr.children[0]));
      if (!is_truthy(left)) return left;
      return eval(*expr.children[1]);
    }
    case Expr::Kind::kOr: {
      PAGODA_ASSIGN_OR_RETURN(Value left, eval(*expr.children[0]));
      if (is_truthy(left)) return left;
      return eval(*expr.children[1]);
    }
    case Expr::Kind::kCompare:
      return eval_compare(expr);
    case Expr::Kind::kConditional: {
      PAGODA_ASSIGN_OR_RETURN(Value condition, eval(*expr.children[1]));
      if (is_truthy(condition)) return eval(*expr.children[0]);
      if (expr.children[2]) return eval(*expr.children[2]);
      return Value::undefined("the conditional expression had no else branch");
    }
  }
  return internal_error("unknown expression");
}

StatusOr<Value> Interpreter::eval_compare(const Expr& expr) {
  PAGODA_ASSIGN_OR_RETURN(Value left, eval(*expr.children[0]));
  for (size_t i = 0; i < expr.compare_ops.size(); ++i) {  // a < b < c is a < b and b < c
    PAGODA_ASSIGN_OR_RETURN(Value right, eval(*expr.children[i + 1]));
    PAGODA_RETURN_IF_ERROR(charge(approximate_size(left) + approximate_size(right)));  // == and `in` scan them
    PAGODA_ASSIGN_OR_RETURN(bool holds, apply_comparison(expr.compare_ops[i], left, right));
    if (!holds) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

// ---- services ----

StatusOr<Value> Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) return callee.as_callable()->invoke(*this, args);
  if (callee.is_undefined()) return invalid_argument_error("{}", callee.undefined_hint());
  return invalid_argument_error("'{}' object is not callable", type_name(callee));
}

StatusOr<Value> Interpreter::get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return invalid_argument_error("{}", object.undefined_hint());
    case Value::Kind::kDict:
      if (!object.as_dict()->is_namespace) {
        if (std::optional<Value> method = find_method(object, name)) return std::move(*method);
      }
      if (const Value* found = object.as_dict()->find(std::string_view(name))) return *found;
      break;
    case Value::Kind::kLoop:
      return loop_attribute(object.as_loop(), name);
    case Value::Kind::kNone:
      return Value::undefined("'None' has no attribute '" + name + "'");
    default:
      if (std::optional<Value> method = find_method(object, name)) return std::move(*method);
      break;
  }
  return Value::undefined(object_description(object) + " has no attribute '" + name + "'");
}

StatusOr<Value> Interpreter::get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return invalid_argument_error("{}", object.undefined_hint());
    case Value::Kind::kDict:
      // an unhashable key is a TypeError in Python, which Jinja's getitem turns into Undefined
      if (!object.as_dict()->is_namespace) {
        if (const Value* found = object.as_dict()->find(key)) return *found;
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (key.is_integral()) {
        if (std::optional<Value> item = index_sequence(object, key.as_int())) return std::move(*item);
        return Value::undefined(object_description(object) + " has no element " + to_python_repr(key));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return get_attribute(object, key.as_string());  // Jinja falls back to attributes
  return Value::undefined(object_description(object) + " has no element " + to_python_repr(key));
}

StatusOr<Value> Interpreter::loop_attribute(const std::shared_ptr<LoopState>& state, const std::string& name) {
  const LoopState& loop = *state;
  const auto& items = loop.items->items;
  const int64_t length = static_cast<int64_t>(items.size());
  const int64_t index0 = static_cast<int64_t>(loop.index0);
  if (name == "index0") return Value(index0);
  if (name == "index") return Value(index0 + 1);
  if (name == "revindex") return Value(length - index0);
  if (name == "revindex0") return Value(length - index0 - 1);
  if (name == "first") return Value(index0 == 0);
  if (name == "last") return Value(index0 == length - 1);
  if (name == "length") return Value(length);
  if (name == "depth") return Value(static_cast<int64_t>(loop.depth0 + 1));
  if (name == "depth0") return Value(static_cast<int64_t>(loop.depth0));
  if (name == "previtem") {
    if (index0 == 0) return Value::undefined("there is no previous item");
    return items[loop.index0 - 1];
  }
  if (name == "nextitem") {
    if (index0 + 1 >= length) return Value::undefined("there is no next item");
    return items[loop.index0 + 1];
  }
  if (name == "cycle") {
    const size_t index = loop.index0;
    return Value::callable("loop.cycle", [index](Interpreter&, CallArgs& args) -> StatusOr<Value> {
      if (args.positional.empty()) return invalid_argument_error("no items for cycling given");
      return args.positional[index % args.positional.size()];
    });
  }
  if (name == "changed") {
    // loop.changed(x): true on the first call and whenever x differs from the last call's
    return Value::callable("loop.changed", [state](Interpreter&, CallArgs& args) -> StatusOr<Value> {
      Value current = Value::tuple(args.positional);
      const bool changed = !state->has_last_changed || !values_equal(*state->last_changed, current);
      state->last_changed = std::move(current);
      state->has_last_changed = true;
      return Value(changed);
    });
  }
  return Value::undefined("'LoopContext object' has no attribute '" + name + "'");
}

StatusOr<Value> Interpreter::apply_filter(std::string_view name, const Value& subject, CallArgs& args) {
  const FilterFunction filter = find_filter(name);
  if (filter == nullptr) return invalid_argument_error("unknown filter '{}'", name);
  // map() and friends apply filters item by item, outside eval(): charged here as eval charges
  PAGODA_RETURN_IF_ERROR(charge(approximate_size(subject)));
  PAGODA_ASSIGN_OR_RETURN(Value result, filter(*this, subject, args));
  PAGODA_RETURN_IF_ERROR(charge(approximate_size(result)));
  return result;
}

StatusOr<bool> Interpreter::apply_test(std::string_view name, const Value& subject, CallArgs& args) {
  const TestFunction test = find_test(name);
  if (test == nullptr) return invalid_argument_error("unknown test '{}'", name);
  PAGODA_RETURN_IF_ERROR(charge(approximate_size(subject)));
  return test(*this, subject, args);
}

Status Interpreter::count_iterations(uint64_t n) {
  iterations_ += n;
  if (iterations_ > options_.limits.max_loop_iterations) {
    return resource_exhausted_error("the template ran more than {} loop iterations (runaway loop?)",
                                    options_.limits.max_loop_iterations);
  }
  return ok_status();
}

Status Interpreter::charge(uint64_t bytes) {
  return WorkMeter::spend(bytes) ? ok_status() : WorkMeter::exhausted_error();
}

Status Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes) {
    return resource_exhausted_error("a template value would exceed the render limit of {} bytes",
                                    options_.limits.max_output_bytes);
  }
  return ok_status();
}

}  // namespace pagoda::chat
