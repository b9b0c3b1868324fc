#include "pagoda/chat/parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "pagoda/chat/filters.h"
#include "pagoda/chat/is_tests.h"

namespace pagoda::chat {
namespace {

// Jinja tags pagoda does not implement: named in the error so a template author knows why.
constexpr std::string_view kUnsupportedTags[] = {
    "include", "import", "from", "extends", "block", "call", "autoescape", "trans", "pluralize",
    "print", "do", "endblock", "endcall", "endautoescape", "endtrans"};

constexpr std::string_view kEndTags[] = {"endif", "elif", "else", "endfor", "endmacro", "endset",
                                         "endfilter", "endwith", "endgeneration"};

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  StatusOr<NodeList> parse_all() {
    PAGODA_ASSIGN_OR_RETURN(NodeList nodes, parse_statements({}));
    if (current().type != TokenType::kEnd) {
      // parse_statements stopped at an end tag nothing opened
      return invalid_argument_error("line {}: unexpected '{{% {} %}}' (nothing open for it to close)",
                                    peek(1).line, peek(1).value);
    }
    return nodes;
  }

 private:
  // ---- token helpers ----

  const Token& current() const { return tokens_[position_]; }
  const Token& peek(size_t ahead) const {
    return tokens_[std::min(position_ + ahead, tokens_.size() - 1)];
  }
  void next() {
    if (position_ + 1 < tokens_.size()) ++position_;
  }
  bool at_operator(std::string_view op) const {
    return current().type == TokenType::kOperator && current().value == op;
  }
  bool at_name(std::string_view name) const {
    return current().type == TokenType::kName && current().value == name;
  }
  static std::string describe(const Token& token) {
    switch (token.type) {
      case TokenType::kName:
      case TokenType::kOperator:
      case TokenType::kInteger:
      case TokenType::kFloat:
        return "'" + token.value + "'";
      case TokenType::kString:
        return "string literal";
      default:
        return std::string(token_type_name(token.type));
    }
  }
  Status unexpected(std::string_view wanted) const {
    return invalid_argument_error("line {}: expected {}, got {}", current().line, wanted, describe(current()));
  }
  Status expect_operator(std::string_view op) {
    if (!at_operator(op)) return unexpected("'" + std::string(op) + "'");
    next();
    return ok_status();
  }
  Status expect_name(std::string_view name) {
    if (!at_name(name)) return unexpected("'" + std::string(name) + "'");
    next();
    return ok_status();
  }
  StatusOr<std::string> take_name(std::string_view what) {
    if (current().type != TokenType::kName) return unexpected(what);
    std::string name = current().value;
    next();
    return name;
  }
  Status expect_block_end() {
    if (current().type != TokenType::kBlockEnd) return unexpected("end of tag '%}'");
    next();
    return ok_status();
  }

  // Guards recursion depth; the guard object pops on scope exit.
  class DepthGuard {
   public:
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    bool too_deep() const { return depth_ > kMaxTemplateNesting; }

   private:
    int& depth_;
  };
  Status nesting_error() const {
    return invalid_argument_error("line {}: template nests deeper than {} levels", current().line, kMaxTemplateNesting);
  }

  static ExprPtr make(Expr::Kind kind, int line) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = line;
    return expr;
  }

  // ---- statements ----

  // Parses until the end of input or a `{% tag` with tag in end_tags (left unconsumed, with
  // current() at the tag's name).
  StatusOr<NodeList> parse_statements(std::initializer_list<std::string_view> end_tags) {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return nesting_error();
    NodeList nodes;
    while (true) {
      const Token& token = current();
      switch (token.type) {
        case TokenType::kEnd:
          if (end_tags.size() != 0) {
            return invalid_argument_error("line {}: unexpected end of template, expected '{{% {} %}}'",
                                          token.line, *end_tags.begin());
          }
          return nodes;
        case TokenType::kData: {
          auto node = std::make_unique<Node>();
          node->kind = Node::Kind::kText;
          node->line = token.line;
          node->text = token.value;
          nodes.push_back(std::move(node));
          next();
          break;
        }
        case TokenType::kVariableBegin: {
          next();
          auto node = std::make_unique<Node>();
          node->kind = Node::Kind::kOutput;
          node->line = token.line;
          PAGODA_ASSIGN_OR_RETURN(node->expr, parse_tuple(true, false, {}));
          if (current().type != TokenType::kVariableEnd) return unexpected("end of print statement '}}'");
          next();
          nodes.push_back(std::move(node));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& tag = peek(1);
          if (tag.type != TokenType::kName) {
            next();
            return unexpected("a tag name after '{%'");
          }
          const bool is_end_tag = std::find(std::begin(kEndTags), std::end(kEndTags), tag.value) != std::end(kEndTags);
          if (is_end_tag) {
            if (std::find(end_tags.begin(), end_tags.end(), tag.value) != end_tags.end()) {
              next();  // leave current() at the tag name for the caller
              return nodes;
            }
            if (end_tags.size() == 0) return nodes;  // parse_all reports it
            return invalid_argument_error("line {}: unexpected '{{% {} %}}', expected '{{% {} %}}'", tag.line,
                                          tag.value, *end_tags.begin());
          }
          next();
          PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Node> node, parse_tag());
          nodes.push_back(std::move(node));
          break;
        }
        default:
          return unexpected("template data or a tag");
      }
    }
  }

  // current() is the tag name after '{%'.
  StatusOr<std::unique_ptr<Node>> parse_tag() {
    const Token tag = current();
    const std::string& name = tag.value;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "generation") return parse_simple_block(Node::Kind::kGeneration, "endgeneration");
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return invalid_argument_error("line {}: '{{% {} %}}' outside of a for loop", tag.line, name);
      next();
      PAGODA_RETURN_IF_ERROR(expect_block_end());
      auto node = std::make_unique<Node>();
      node->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      node->line = tag.line;
      return node;
    }
    if (std::find(std::begin(kUnsupportedTags), std::end(kUnsupportedTags), name) != std::end(kUnsupportedTags)) {
      return unimplemented_error("line {}: unsupported template construct '{{% {} %}}'", tag.line, name);
    }
    return invalid_argument_error("line {}: unknown tag '{{% {} %}}'", tag.line, name);
  }

  StatusOr<std::unique_ptr<Node>> parse_if() {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::kIf;
    node->line = current().line;
    next();  // if
    while (true) {
      PAGODA_ASSIGN_OR_RETURN(ExprPtr condition, parse_tuple(false, false, {}));
      PAGODA_RETURN_IF_ERROR(expect_block_end());
      PAGODA_ASSIGN_OR_RETURN(NodeList body, parse_statements({"endif", "elif", "else"}));
      node->branches.emplace_back(std::move(condition), std::move(body));
      const std::string tag = current().value;
      next();
      if (tag == "elif") continue;
      if (tag == "else") {
        PAGODA_RETURN_IF_ERROR(expect_block_end());
        PAGODA_ASSIGN_OR_RETURN(node->else_body, parse_statements({"endif"}));
        next();
      }
      PAGODA_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
  }

  // Names separated by commas, optionally in parentheses: `x`, `key, value`, `(a, b)`.
  StatusOr<std::vector<std::string>> parse_target_names() {
    const bool parenthesized = at_operator("(");
    if (parenthesized) next();
    std::vector<std::string> names;
    while (true) {
      if (at_operator("(")) {
        return unimplemented_error("line {}: unsupported template construct: nested tuple unpacking", current().line);
      }
      PAGODA_ASSIGN_OR_RETURN(std::string name, take_name("a variable name"));
      names.push_back(std::move(name));
      if (!at_operator(",")) break;
      next();
      if (at_name("in") || at_operator("=") || at_operator(")")) break;  // trailing comma
    }
    if (parenthesized) PAGODA_RETURN_IF_ERROR(expect_operator(")"));
    return names;
  }

  StatusOr<std::unique_ptr<Node>> parse_for() {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::kFor;
    node->line = current().line;
    next();  // for
    PAGODA_ASSIGN_OR_RETURN(node->targets, parse_target_names());
    PAGODA_RETURN_IF_ERROR(expect_name("in"));
    PAGODA_ASSIGN_OR_RETURN(node->expr, parse_tuple(false, false, {"recursive"}));
    if (at_name("if")) {
      next();
      PAGODA_ASSIGN_OR_RETURN(node->filter_expr, parse_expression(true));
    }
    if (at_name("recursive")) {
      return unimplemented_error("line {}: unsupported template construct: recursive for loops", current().line);
    }
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    ++loop_depth_;
    auto body = parse_statements({"endfor", "else"});
    --loop_depth_;
    if (!body.ok()) return body.status();
    node->body = std::move(body).value();
    const std::string tag = current().value;
    next();
    if (tag == "else") {
      PAGODA_RETURN_IF_ERROR(expect_block_end());
      // `loop`, break and continue do not exist in a for's else
      const int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;
      auto else_body = parse_statements({"endfor"});
      loop_depth_ = saved_loop_depth;
      if (!else_body.ok()) return else_body.status();
      node->else_body = std::move(else_body).value();
      next();
    }
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  StatusOr<std::unique_ptr<Node>> parse_set() {
    auto node = std::make_unique<Node>();
    node->line = current().line;
    next();  // set
    if (current().type == TokenType::kName && peek(1).type == TokenType::kOperator && peek(1).value == ".") {
      node->kind = Node::Kind::kSet;
      node->namespace_name = current().value;
      next();
      next();
      PAGODA_ASSIGN_OR_RETURN(node->attribute, take_name("an attribute name"));
      PAGODA_RETURN_IF_ERROR(expect_operator("="));
      PAGODA_ASSIGN_OR_RETURN(node->expr, parse_tuple(true, false, {}));
      PAGODA_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
    PAGODA_ASSIGN_OR_RETURN(node->targets, parse_target_names());
    if (at_operator("=")) {
      next();
      node->kind = Node::Kind::kSet;
      PAGODA_ASSIGN_OR_RETURN(node->expr, parse_tuple(true, false, {}));
      PAGODA_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
    if (node->targets.size() != 1) return unexpected("'='");
    if (at_operator("|")) {
      return unimplemented_error("line {}: unsupported template construct: filters on a block set", current().line);
    }
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    node->kind = Node::Kind::kSetBlock;
    PAGODA_ASSIGN_OR_RETURN(node->body, parse_statements({"endset"}));
    next();
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  StatusOr<std::unique_ptr<Node>> parse_macro() {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::kMacro;
    node->line = current().line;
    next();  // macro
    PAGODA_ASSIGN_OR_RETURN(node->name, take_name("a macro name"));
    PAGODA_RETURN_IF_ERROR(expect_operator("("));
    while (!at_operator(")")) {
      if (!node->params.empty()) PAGODA_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator(")")) break;
      PAGODA_ASSIGN_OR_RETURN(std::string param, take_name("a parameter name"));
      ExprPtr default_value;
      if (at_operator("=")) {
        next();
        PAGODA_ASSIGN_OR_RETURN(default_value, parse_expression(true));
      } else if (!node->params.empty() && node->params.back().second) {
        return invalid_argument_error("line {}: non-default argument '{}' follows default argument", current().line, param);
      }
      node->params.emplace_back(std::move(param), std::move(default_value));
    }
    next();  // )
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot cross a macro
    auto body = parse_statements({"endmacro"});
    loop_depth_ = saved_loop_depth;
    if (!body.ok()) return body.status();
    node->body = std::move(body).value();
    next();
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  StatusOr<std::unique_ptr<Node>> parse_filter_block() {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::kFilterBlock;
    node->line = current().line;
    next();  // filter
    while (true) {
      PAGODA_ASSIGN_OR_RETURN(ExprPtr filter, parse_filter(nullptr));
      node->filters.push_back(std::move(filter));
      if (!at_operator("|")) break;
      next();
    }
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    PAGODA_ASSIGN_OR_RETURN(node->body, parse_statements({"endfilter"}));
    next();
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  StatusOr<std::unique_ptr<Node>> parse_with() {
    auto node = std::make_unique<Node>();
    node->kind = Node::Kind::kWith;
    node->line = current().line;
    next();  // with
    while (current().type != TokenType::kBlockEnd) {
      if (!node->params.empty()) PAGODA_RETURN_IF_ERROR(expect_operator(","));
      PAGODA_ASSIGN_OR_RETURN(std::string name, take_name("a variable name"));
      PAGODA_RETURN_IF_ERROR(expect_operator("="));
      PAGODA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      node->params.emplace_back(std::move(name), std::move(value));
    }
    next();
    PAGODA_ASSIGN_OR_RETURN(node->body, parse_statements({"endwith"}));
    next();
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  StatusOr<std::unique_ptr<Node>> parse_simple_block(Node::Kind kind, std::string_view end_tag) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->line = current().line;
    next();
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    if (end_tag == "endgeneration") {
      PAGODA_ASSIGN_OR_RETURN(node->body, parse_statements({"endgeneration"}));
    }
    next();
    PAGODA_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  // ---- expressions ----

  bool at_tuple_end(std::initializer_list<std::string_view> extra_end_names) const {
    if (current().type == TokenType::kVariableEnd || current().type == TokenType::kBlockEnd ||
        current().type == TokenType::kEnd || at_operator(")")) {
      return true;
    }
    if (current().type == TokenType::kName) {
      return std::find(extra_end_names.begin(), extra_end_names.end(), current().value) != extra_end_names.end();
    }
    return false;
  }

  // `a`, or `a, b, ...` as a tuple.
  StatusOr<ExprPtr> parse_tuple(bool with_condexpr, bool explicit_parentheses,
                                std::initializer_list<std::string_view> extra_end_names) {
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) PAGODA_RETURN_IF_ERROR(expect_operator(","));
      if (at_tuple_end(extra_end_names)) break;
      PAGODA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(with_condexpr));
      items.push_back(std::move(item));
      if (at_operator(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return unexpected("an expression");
    }
    ExprPtr tuple = make(Expr::Kind::kTuple, line);
    tuple->children = std::move(items);
    return tuple;
  }

  StatusOr<ExprPtr> parse_expression(bool with_condexpr) {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return nesting_error();
    if (!with_condexpr) return parse_or();
    PAGODA_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
    while (at_name("if")) {
      const int line = current().line;
      next();
      PAGODA_ASSIGN_OR_RETURN(ExprPtr condition, parse_or());
      ExprPtr otherwise;
      if (at_name("else")) {
        next();
        PAGODA_ASSIGN_OR_RETURN(otherwise, parse_expression(true));
      }
      ExprPtr conditional = make(Expr::Kind::kConditional, line);
      conditional->children.push_back(std::move(expr));
      conditional->children.push_back(std::move(condition));
      conditional->children.push_back(std::move(otherwise));
      expr = std::move(conditional);
    }
    return expr;
  }

  StatusOr<ExprPtr> parse_or() {
    PAGODA_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (at_name("or")) {
      const int line = current().line;
      next();
      PAGODA_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      ExprPtr node = make(Expr::Kind::kOr, line);
      node->children.push_back(std::move(left));
      node->children.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_and() {
    PAGODA_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (at_name("and")) {
      const int line = current().line;
      next();
      PAGODA_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      ExprPtr node = make(Expr::Kind::kAnd, line);
      node->children.push_back(std::move(left));
      node->children.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_not() {
    if (at_name("not")) {
      DepthGuard guard(depth_);
      if (guard.too_deep()) return nesting_error();
      const int line = current().line;
      next();
      PAGODA_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      ExprPtr node = make(Expr::Kind::kUnary, line);
      node->name = "not";
      node->children.push_back(std::move(operand));
      return node;
    }
    return parse_compare();
  }

  StatusOr<ExprPtr> parse_compare() {
    const int line = current().line;
    PAGODA_ASSIGN_OR_RETURN(ExprPtr first, parse_binary(0));
    ExprPtr compare;
    while (true) {
      std::string op;
      if (current().type == TokenType::kOperator &&
          (current().value == "==" || current().value == "!=" || current().value == "<" ||
           current().value == "<=" || current().value == ">" || current().value == ">=")) {
        op = current().value;
        next();
      } else if (at_name("in")) {
        op = "in";
        next();
      } else if (at_name("not") && peek(1).type == TokenType::kName && peek(1).value == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!compare) {
        compare = make(Expr::Kind::kCompare, line);
        compare->children.push_back(std::move(first));
      }
      PAGODA_ASSIGN_OR_RETURN(ExprPtr operand, parse_binary(0));
      compare->compare_ops.push_back(std::move(op));
      compare->children.push_back(std::move(operand));
    }
    return compare ? std::move(compare) : std::move(first);
  }

  // Binary operators by Jinja's levels: 0: + -, 1: ~, 2: * / // %, 3: ** (all left-assoc).
  StatusOr<ExprPtr> parse_binary(int level) {
    if (level == 4) return parse_unary(true);
    static const std::vector<std::vector<std::string_view>> kLevels = {
        {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    PAGODA_ASSIGN_OR_RETURN(ExprPtr left, parse_binary(level + 1));
    while (current().type == TokenType::kOperator) {
      const auto& ops = kLevels[static_cast<size_t>(level)];
      if (std::find(ops.begin(), ops.end(), current().value) == ops.end()) break;
      ExprPtr node = make(Expr::Kind::kBinary, current().line);
      node->name = current().value;
      next();
      PAGODA_ASSIGN_OR_RETURN(ExprPtr right, parse_binary(level + 1));
      node->children.push_back(std::move(left));
      node->children.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  StatusOr<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(depth_);
    if (guard.too_deep()) return nesting_error();
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      node = make(Expr::Kind::kUnary, current().line);
      node->name = current().value;
      next();
      PAGODA_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      node->children.push_back(std::move(operand));
    } else {
      PAGODA_ASSIGN_OR_RETURN(node, parse_primary());
    }
    PAGODA_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      PAGODA_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
    }
    return node;
  }

  StatusOr<ExprPtr> parse_primary() {
    const Token& token = current();
    const int line = token.line;
    switch (token.type) {
      case TokenType::kName: {
        ExprPtr node = make(Expr::Kind::kLiteral, line);
        if (token.value == "true" || token.value == "True") {
          node->literal = Value(true);
        } else if (token.value == "false" || token.value == "False") {
          node->literal = Value(false);
        } else if (token.value == "none" || token.value == "None") {
          node->literal = Value::none();
        } else {
          node->kind = Expr::Kind::kName;
          node->name = token.value;
        }
        next();
        return node;
      }
      case TokenType::kString: {
        std::string text = token.value;
        next();
        while (current().type == TokenType::kString) {  // adjacent literals concatenate
          text += current().value;
          next();
        }
        ExprPtr node = make(Expr::Kind::kLiteral, line);
        node->literal = Value(std::move(text));
        return node;
      }
      case TokenType::kInteger: {
        ExprPtr node = make(Expr::Kind::kLiteral, line);
        errno = 0;
        char* end = nullptr;
        const long long value = std::strtoll(token.value.c_str(), &end, 10);
        if (errno == ERANGE) return out_of_range_error("line {}: integer literal {} does not fit in 64 bits", line, token.value);
        node->literal = Value(static_cast<int64_t>(value));
        next();
        return node;
      }
      case TokenType::kFloat: {
        ExprPtr node = make(Expr::Kind::kLiteral, line);
        node->literal = Value(std::strtod(token.value.c_str(), nullptr));
        next();
        return node;
      }
      case TokenType::kOperator:
        if (token.value == "(") {
          next();
          PAGODA_ASSIGN_OR_RETURN(ExprPtr inner, parse_tuple(true, true, {}));
          PAGODA_RETURN_IF_ERROR(expect_operator(")"));
          return inner;
        }
        if (token.value == "[") return parse_list();
        if (token.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    return unexpected("an expression");
  }

  StatusOr<ExprPtr> parse_list() {
    ExprPtr node = make(Expr::Kind::kList, current().line);
    next();  // [
    while (!at_operator("]")) {
      if (!node->children.empty()) PAGODA_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator("]")) break;
      PAGODA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      node->children.push_back(std::move(item));
    }
    next();  // ]
    return node;
  }

  StatusOr<ExprPtr> parse_dict() {
    ExprPtr node = make(Expr::Kind::kDict, current().line);
    next();  // {
    while (!at_operator("}")) {
      if (!node->children.empty()) PAGODA_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator("}")) break;
      PAGODA_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
      PAGODA_RETURN_IF_ERROR(expect_operator(":"));
      PAGODA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      node->children.push_back(std::move(key));
      node->children.push_back(std::move(value));
    }
    next();  // }
    return node;
  }

  StatusOr<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      if (at_operator(".")) {
        const int line = current().line;
        next();
        if (current().type == TokenType::kName) {
          ExprPtr attribute = make(Expr::Kind::kAttribute, line);
          attribute->name = current().value;
          attribute->children.push_back(std::move(node));
          node = std::move(attribute);
        } else if (current().type == TokenType::kInteger) {  // x.0 is x[0]
          ExprPtr item = make(Expr::Kind::kItem, line);
          ExprPtr index = make(Expr::Kind::kLiteral, line);
          index->literal = Value(static_cast<int64_t>(std::strtoll(current().value.c_str(), nullptr, 10)));
          item->children.push_back(std::move(node));
          item->children.push_back(std::move(index));
          node = std::move(item);
        } else {
          return unexpected("an attribute name after '.'");
        }
        next();
      } else if (at_operator("[")) {
        PAGODA_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
      } else if (at_operator("(")) {
        PAGODA_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  StatusOr<ExprPtr> parse_subscript(ExprPtr object) {
    const int line = current().line;
    next();  // [
    std::vector<ExprPtr> parts(3);
    bool is_slice = false;
    if (!at_operator(":")) {
      PAGODA_ASSIGN_OR_RETURN(parts[0], parse_expression(true));
    }
    if (at_operator(":")) {
      is_slice = true;
      next();
      if (!at_operator("]") && !at_operator(":")) {
        PAGODA_ASSIGN_OR_RETURN(parts[1], parse_expression(true));
      }
      if (at_operator(":")) {
        next();
        if (!at_operator("]")) {
          PAGODA_ASSIGN_OR_RETURN(parts[2], parse_expression(true));
        }
      }
    } else if (at_operator(",")) {
      return unimplemented_error("line {}: unsupported template construct: tuple subscripts x[a, b]", line);
    }
    PAGODA_RETURN_IF_ERROR(expect_operator("]"));
    ExprPtr node = make(is_slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
    node->children.push_back(std::move(object));
    if (is_slice) {
      for (ExprPtr& part : parts) node->children.push_back(std::move(part));
    } else {
      node->children.push_back(std::move(parts[0]));
    }
    return node;
  }

  // Parses `(a, b, key=c)` into node's children (after those already there) and keyword_args.
  Status parse_call_args(Expr& node) {
    PAGODA_RETURN_IF_ERROR(expect_operator("("));
    bool first = true;
    while (!at_operator(")")) {
      if (!first) PAGODA_RETURN_IF_ERROR(expect_operator(","));
      first = false;
      if (at_operator(")")) break;
      if (at_operator("*") || at_operator("**")) {
        return unimplemented_error("line {}: unsupported template construct: *args / **kwargs in a call", current().line);
      }
      if (current().type == TokenType::kName && peek(1).type == TokenType::kOperator && peek(1).value == "=") {
        std::string key = current().value;
        next();
        next();
        PAGODA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        node.keyword_args.emplace_back(std::move(key), std::move(value));
      } else {
        if (!node.keyword_args.empty()) {
          return invalid_argument_error("line {}: positional argument follows keyword argument", current().line);
        }
        PAGODA_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        node.children.push_back(std::move(value));
      }
    }
    next();  // )
    return ok_status();
  }

  StatusOr<ExprPtr> parse_call(ExprPtr callee) {
    ExprPtr node = make(Expr::Kind::kCall, current().line);
    node->children.push_back(std::move(callee));
    PAGODA_RETURN_IF_ERROR(parse_call_args(*node));
    return node;
  }

  StatusOr<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      if (at_operator("|")) {
        next();
        PAGODA_ASSIGN_OR_RETURN(node, parse_filter(std::move(node)));
      } else if (at_name("is")) {
        PAGODA_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
      } else if (at_operator("(")) {
        PAGODA_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // current() is the filter name (after '|'). subject may be null (filter blocks).
  StatusOr<ExprPtr> parse_filter(ExprPtr subject) {
    const int line = current().line;
    PAGODA_ASSIGN_OR_RETURN(std::string name, take_name("a filter name"));
    ExprPtr node = make(Expr::Kind::kFilter, line);
    node->filter = find_filter(name);
    if (node->filter == nullptr) {
      return invalid_argument_error("line {}: unknown filter '{}' (not one pagoda implements)", line, name);
    }
    node->name = std::move(name);
    node->children.push_back(std::move(subject));
    if (at_operator("(")) PAGODA_RETURN_IF_ERROR(parse_call_args(*node));
    return node;
  }

  StatusOr<ExprPtr> parse_test(ExprPtr subject) {
    const int line = current().line;
    next();  // is
    ExprPtr node = make(Expr::Kind::kTest, line);
    if (at_name("not")) {
      node->negated = true;
      next();
    }
    PAGODA_ASSIGN_OR_RETURN(std::string name, take_name("a test name after 'is'"));
    node->test = find_test(name);
    if (node->test == nullptr) {
      return invalid_argument_error("line {}: unknown test 'is {}' (not one pagoda implements)", line, name);
    }
    node->name = std::move(name);
    node->children.push_back(std::move(subject));
    if (at_operator("(")) {
      PAGODA_RETURN_IF_ERROR(parse_call_args(*node));
    } else if ((current().type == TokenType::kName && !at_name("else") && !at_name("or") && !at_name("and") &&
                !at_name("is") && !at_name("if") && !at_name("in") && !at_name("not")) ||
               current().type == TokenType::kString || current().type == TokenType::kInteger ||
               current().type == TokenType::kFloat || at_operator("[") || at_operator("{")) {
      // `x is divisibleby 3`, `x is sameas false`: one argument without parentheses
      PAGODA_ASSIGN_OR_RETURN(ExprPtr argument, parse_primary());
      PAGODA_ASSIGN_OR_RETURN(argument, parse_postfix(std::move(argument)));
      node->children.push_back(std::move(argument));
    }
    return node;
  }

  const std::vector<Token>& tokens_;
  size_t position_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

StatusOr<NodeList> parse_template(const std::vector<Token>& tokens) {
  Parser parser(tokens);
  return parser.parse_all();
}

}  // namespace pagoda::chat
