#pragma once
// The syntax tree of a parsed template: expressions (Expr) and statements (Node). Built once
// by the parser, then only read by any number of concurrent renders.
//
// Filters and tests are resolved to their functions at parse time, so an unknown filter is a
// parse error (as in Jinja, where it is a compile-time error).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pagoda/chat/value.h"
#include "pagoda/core/status.h"

namespace pagoda::chat {

// A filter: subject | name(args). A test: subject is name(args).
using FilterFunction = StatusOr<Value> (*)(Interpreter& interpreter, const Value& subject, CallArgs& args);
using TestFunction = StatusOr<bool> (*)(Interpreter& interpreter, const Value& subject, CallArgs& args);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // children: items
    kTuple,        // children: items
    kDict,         // children: key, value, key, value, ...
    kAttribute,    // children[0].name
    kItem,         // children[0][children[1]]
    kSlice,        // children[0][children[1]:children[2]:children[3]] (null when omitted)
    kCall,         // children[0](children[1..], keyword_args)
    kFilter,       // children[0] | name(children[1..], keyword_args)
    kTest,         // children[0] is [not] name(children[1..], keyword_args)
    kUnary,        // name ("-", "+", "not") children[0]
    kBinary,       // children[0] name children[1]; name in + - * / // % ** ~
    kAnd,          // children[0] and children[1]
    kOr,           // children[0] or children[1]
    kCompare,      // children[0] ops[0] children[1] ops[1] children[2] ...
    kConditional,  // children[0] if children[1] else children[2] (children[2] may be null)
  };

  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keyword_args;
  std::vector<std::string> compare_ops;  // ==, !=, <, <=, >, >=, in, not in
  FilterFunction filter = nullptr;
  TestFunction test = nullptr;
  bool negated = false;  // `is not`
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body) in order, then else_body
    kFor,          // for targets in expr [if filter_expr] body [else else_body]
    kSet,          // set targets = expr; or set namespace_name.attribute = expr
    kSetBlock,     // {% set targets[0] %}body{% endset %}
    kMacro,        // macro name(params) body
    kFilterBlock,  // {% filter f %}body{% endfilter %}: filters[0..] applied in order
    kWith,         // with assignments body
    kBreak,
    kContinue,
    kGeneration,   // transformers' {% generation %}: renders its body
  };

  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter_expr;
  std::vector<std::string> targets;
  std::string namespace_name;  // kSet on an attribute: {% set ns.attr = ... %}
  std::string attribute;
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
  std::string name;                                   // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null); kWith
  std::vector<ExprPtr> filters;  // kFilterBlock: kFilter exprs whose children[0] is null
};

}  // namespace pagoda::chat
