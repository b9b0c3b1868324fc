#include "pagoda/grammar/json_schema_to_grammar.h"

#include <map>
#include <set>

#include <fmt/format.h>

#include "pagoda/grammar/gbnf_parser.h"
#include "pagoda/grammar/regex_to_grammar.h"

namespace pagoda::grammar {
namespace {

// The shared building blocks, in GBNF. `ws` allows one space, or one newline plus indentation,
// so a model cannot spin on whitespace.
constexpr const char* kCommonRules = R"(
ws ::= ( " " | "\n" [ \t]{0,20} )?
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" json-hex4 )
json-hex4 ::= ( [0-9a-cA-CefEF] [0-9a-fA-F] | [dD] [0-7] ) [0-9a-fA-F] [0-9a-fA-F]
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-nonneg-int ::= "0" | [1-9] [0-9]{0,15}
json-pos-int ::= [1-9] [0-9]{0,15}
json-number ::= json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-nonneg-number ::= json-nonneg-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
json-bool ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
json-date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )
json-time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )
json-uuid ::= [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}
)";

const std::set<std::string> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "contentMediaType", "contentEncoding", "$anchor"};

const std::set<std::string> kUnsupported = {
    "multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "patternProperties",
    "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else",
    "not", "unevaluatedProperties", "unevaluatedItems", "exclusiveMinimum", "exclusiveMaximum",
    "maximum", "$dynamicRef", "$recursiveRef"};

std::string json_literal(const nlohmann::ordered_json& value) { return value.dump(); }

class Converter {
 public:
  Converter(const nlohmann::ordered_json& root, std::string where) : root_(root), where_(std::move(where)) {}

  StatusOr<std::shared_ptr<const Grammar>> convert(const JsonFraming& framing) {
    PAGODA_ASSIGN_OR_RETURN(rules_, parse_gbnf_rules(kCommonRules));
    PAGODA_ASSIGN_OR_RETURN(ExprPtr value, visit(root_, where_));
    if (framing.min_items < 1 || (framing.max_items != kUnbounded && framing.max_items < framing.min_items)) {
      return invalid_argument_error("{}: bad item counts [{}, {}]", where_, framing.min_items, framing.max_items);
    }
    rules_["framed-item"] = make_sequence({make_literal(framing.item_prefix), value, make_literal(framing.item_suffix)});
    const uint32_t more_max = framing.max_items == kUnbounded ? kUnbounded : framing.max_items - 1;
    rules_["root"] = make_sequence(
        {make_literal(framing.open), make_rule_ref("framed-item"),
         make_repeat(make_sequence({make_literal(framing.separator), make_rule_ref("framed-item")}),
                     framing.min_items - 1, more_max),
         make_literal(framing.close)});
    return lower_grammar(rules_, "root");
  }

 private:
  Status unsupported(const std::string& path, const std::string& why) const {
    return invalid_argument_error("{}: {}", path, why);
  }

  StatusOr<ExprPtr> visit(const nlohmann::ordered_json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return make_rule_ref("json-value");
      return unsupported(path, "the schema false admits no value");
    }
    if (!s.is_object()) return unsupported(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (kUnsupported.contains(key)) {
        return unsupported(path + "." + key,
                           fmt::format("\"{}\" is not supported by pagoda's constrained decoding", key));
      }
    }
    if (s.contains("$ref")) return visit_ref(s, path);
    if (s.contains("const")) return make_literal(json_literal(s["const"]));
    if (s.contains("enum")) {
      const auto& values = s["enum"];
      if (!values.is_array() || values.empty()) return unsupported(path + ".enum", "expected a non-empty array");
      std::vector<ExprPtr> options;
      for (const auto& v : values) options.push_back(make_literal(json_literal(v)));
      return make_alternatives(std::move(options));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const auto& list = s[key];
      if (!list.is_array() || list.empty()) return unsupported(path + "." + key, "expected a non-empty array");
      std::vector<ExprPtr> options;
      for (size_t i = 0; i < list.size(); ++i) {
        PAGODA_ASSIGN_OR_RETURN(ExprPtr option, visit(merged_with_siblings(s, key, list[i]),
                                                      fmt::format("{}.{}[{}]", path, key, i)));
        options.push_back(std::move(option));
      }
      return make_alternatives(std::move(options));
    }
    if (s.contains("allOf")) {
      const auto& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) {
        return unsupported(path + ".allOf", "only an allOf with exactly one schema is supported");
      }
      return visit(merged_with_siblings(s, "allOf", list[0]), path + ".allOf[0]");
    }
    if (s.contains("type")) {
      const auto& type = s["type"];
      if (type.is_string()) return visit_type(s, type.get<std::string>(), path);
      if (type.is_array() && !type.empty()) {
        std::vector<ExprPtr> options;
        for (const auto& t : type) {
          if (!t.is_string()) return unsupported(path + ".type", "expected type names");
          PAGODA_ASSIGN_OR_RETURN(ExprPtr option, visit_type(s, t.get<std::string>(), path));
          options.push_back(std::move(option));
        }
        return make_alternatives(std::move(options));
      }
      return unsupported(path + ".type", "expected a type name or a non-empty list of them");
    }
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      return visit_type(s, "object", path);
    }
    if (s.contains("items") || s.contains("prefixItems")) return visit_type(s, "array", path);
    for (const char* key : {"minLength", "maxLength", "pattern"})
      if (s.contains(key)) return visit_type(s, "string", path);
    return make_rule_ref("json-value");
  }

  // anyOf / oneOf / allOf branches inherit the keywords beside them (e.g. a shared "type").
  nlohmann::ordered_json merged_with_siblings(const nlohmann::ordered_json& s, const char* key, const nlohmann::ordered_json& branch) {
    if (!branch.is_object()) return branch;
    nlohmann::ordered_json merged = branch;
    for (const auto& [k, v] : s.items()) {
      if (k == key || kAnnotations.contains(k) || merged.contains(k)) continue;
      merged[k] = v;
    }
    return merged;
  }

  StatusOr<ExprPtr> visit_ref(const nlohmann::ordered_json& s, const std::string& path) {
    const auto& ref = s["$ref"];
    if (!ref.is_string()) return unsupported(path + ".$ref", "expected a string");
    const std::string target = ref.get<std::string>();
    if (auto it = ref_rules_.find(target); it != ref_rules_.end()) return make_rule_ref(it->second);
    if (target != "#" && !target.starts_with("#/")) {
      return unsupported(path + ".$ref", "only references inside the schema (\"#/...\") are supported");
    }
    const nlohmann::ordered_json* node = &root_;
    std::string pointer = target.substr(1);
    size_t pos = 0;
    while (pos < pointer.size()) {
      const size_t next = pointer.find('/', pos + 1);
      std::string token = pointer.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
      for (size_t p; (p = token.find("~1")) != std::string::npos;) token.replace(p, 2, "/");
      for (size_t p; (p = token.find("~0")) != std::string::npos;) token.replace(p, 2, "~");
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        return unsupported(path + ".$ref", fmt::format("\"{}\" does not resolve inside the schema", target));
      }
      if (next == std::string::npos) break;
      pos = next;
    }
    const std::string name = fmt::format("ref-{}", ref_rules_.size());
    ref_rules_[target] = name;
    rules_[name] = make_empty();  // placeholder while the target (maybe recursive) is visited
    PAGODA_ASSIGN_OR_RETURN(ExprPtr body, visit(*node, where_ + target.substr(1)));
    rules_[name] = body;
    return make_rule_ref(name);
  }

  StatusOr<ExprPtr> visit_type(const nlohmann::ordered_json& s, const std::string& type, const std::string& path) {
    if (type == "string") return visit_string(s, path);
    if (type == "integer" || type == "number") return visit_number(s, type, path);
    if (type == "boolean") return make_rule_ref("json-bool");
    if (type == "null") return make_rule_ref("json-null");
    if (type == "object") return visit_object(s, path);
    if (type == "array") return visit_array(s, path);
    return unsupported(path + ".type", fmt::format("unknown type \"{}\"", type));
  }

  StatusOr<uint32_t> count(const nlohmann::ordered_json& s, const char* key, const std::string& path, uint32_t fallback) {
    if (!s.contains(key)) return fallback;
    const auto& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 100000) {
      return unsupported(path + "." + key, "expected an integer in [0, 100000]");
    }
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  StatusOr<ExprPtr> visit_string(const nlohmann::ordered_json& s, const std::string& path) {
    PAGODA_ASSIGN_OR_RETURN(uint32_t min, count(s, "minLength", path, 0));
    PAGODA_ASSIGN_OR_RETURN(uint32_t max, count(s, "maxLength", path, kUnbounded));
    if (max != kUnbounded && min > max) return unsupported(path + ".minLength", "greater than maxLength");
    const bool has_length = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (has_length) return unsupported(path + ".pattern", "a pattern together with minLength/maxLength is not supported");
      if (!s["pattern"].is_string()) return unsupported(path + ".pattern", "expected a string");
      auto body = regex_to_expr(s["pattern"].get<std::string>(), {.search = true, .json_string_content = true});
      if (!body.ok()) return unsupported(path + ".pattern", body.status().message());
      return make_sequence({make_literal("\""), *body, make_literal("\"")});
    }
    if (s.contains("format") && s["format"].is_string() && !has_length) {
      const std::string format = s["format"].get<std::string>();
      auto quoted = [](ExprPtr e) { return make_sequence({make_literal("\""), std::move(e), make_literal("\"")}); };
      if (format == "date") return quoted(make_rule_ref("json-date"));
      if (format == "time") return quoted(make_rule_ref("json-time"));
      if (format == "date-time") return quoted(make_sequence({make_rule_ref("json-date"), make_literal("T"), make_rule_ref("json-time")}));
      if (format == "uuid") return quoted(make_rule_ref("json-uuid"));
    }
    if (!has_length) return make_rule_ref("json-string");
    return make_sequence({make_literal("\""), make_repeat(make_rule_ref("json-char"), min, max), make_literal("\"")});
  }

  StatusOr<ExprPtr> visit_number(const nlohmann::ordered_json& s, const std::string& type, const std::string& path) {
    const bool integer = type == "integer";
    if (!s.contains("minimum")) return make_rule_ref(integer ? "json-int" : "json-number");
    const auto& minimum = s["minimum"];
    if (!minimum.is_number()) return unsupported(path + ".minimum", "expected a number");
    const double m = minimum.get<double>();
    if (integer && m == 1.0) return make_rule_ref("json-pos-int");
    if (m == 0.0) return make_rule_ref(integer ? "json-nonneg-int" : "json-nonneg-number");
    if (m < 0.0 && integer && m <= -1e15) return make_rule_ref("json-int");
    return unsupported(path + ".minimum",
                       integer ? "only minimum 0 or 1 is supported for integers" : "only minimum 0 is supported for numbers");
  }

  StatusOr<ExprPtr> visit_object(const nlohmann::ordered_json& s, const std::string& path) {
    std::vector<std::pair<std::string, ExprPtr>> properties;  // key literal, value
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return unsupported(path + ".required", "expected an array of names");
      for (const auto& name : s["required"]) {
        if (!name.is_string()) return unsupported(path + ".required", "expected an array of names");
        required.insert(name.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return unsupported(path + ".properties", "expected an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        PAGODA_ASSIGN_OR_RETURN(ExprPtr value, visit(sub, path + ".properties." + name));
        properties.emplace_back(name, std::move(value));
      }
    }
    for (const std::string& name : required) {
      bool listed = false;
      for (const auto& [key, value] : properties) listed = listed || key == name;
      if (!listed) properties.emplace_back(name, make_rule_ref("json-value"));
    }
    PAGODA_ASSIGN_OR_RETURN(uint32_t min_props, count(s, "minProperties", path, 0));
    if (s.contains("maxProperties")) return unsupported(path + ".maxProperties", "\"maxProperties\" is not supported");
    if (min_props > required.size()) {
      return unsupported(path + ".minProperties", "only a minProperties met by the required properties is supported");
    }

    const nlohmann::ordered_json additional = s.value("additionalProperties", nlohmann::ordered_json(true));
    if (properties.empty()) {
      if (additional.is_boolean() && !additional.get<bool>()) return make_literal("{}");
      // A map: string keys to values of the additionalProperties schema.
      ExprPtr value = make_rule_ref("json-value");
      if (additional.is_object()) {
        PAGODA_ASSIGN_OR_RETURN(value, visit(additional, path + ".additionalProperties"));
      }
      ExprPtr pair = make_sequence({make_rule_ref("json-string"), make_rule_ref("ws"), make_literal(":"),
                                    make_rule_ref("ws"), value, make_rule_ref("ws")});
      ExprPtr more = make_repeat(make_sequence({make_literal(","), make_rule_ref("ws"), pair}), 0, kUnbounded);
      return make_sequence({make_literal("{"), make_rule_ref("ws"),
                            make_repeat(make_sequence({pair, more}), 0, 1), make_literal("}")});
    }

    // head_i: properties i.. with none written yet; tail_i: properties i.. after at least one.
    const std::string base = fmt::format("obj-{}", object_count_++);
    const size_t n = properties.size();
    auto member = [&](size_t i) {
      return make_sequence({make_literal(json_literal(properties[i].first)), make_rule_ref("ws"), make_literal(":"),
                            make_rule_ref("ws"), properties[i].second, make_rule_ref("ws")});
    };
    auto tail_name = [&](size_t i) { return fmt::format("{}-tail-{}", base, i); };
    auto head_name = [&](size_t i) { return fmt::format("{}-head-{}", base, i); };
    rules_[tail_name(n)] = make_empty();
    rules_[head_name(n)] = make_empty();
    for (size_t i = n; i-- > 0;) {
      const bool is_required = required.contains(properties[i].first);
      ExprPtr with = make_sequence({make_literal(","), make_rule_ref("ws"), member(i), make_rule_ref(tail_name(i + 1))});
      rules_[tail_name(i)] = is_required ? with : make_alternatives({with, make_rule_ref(tail_name(i + 1))});
      ExprPtr first = make_sequence({member(i), make_rule_ref(tail_name(i + 1))});
      rules_[head_name(i)] = is_required ? first : make_alternatives({first, make_rule_ref(head_name(i + 1))});
    }
    return make_sequence({make_literal("{"), make_rule_ref("ws"), make_rule_ref(head_name(0)), make_literal("}")});
  }

  StatusOr<ExprPtr> visit_array(const nlohmann::ordered_json& s, const std::string& path) {
    PAGODA_ASSIGN_OR_RETURN(uint32_t min, count(s, "minItems", path, 0));
    PAGODA_ASSIGN_OR_RETURN(uint32_t max, count(s, "maxItems", path, kUnbounded));
    if (max != kUnbounded && min > max) return unsupported(path + ".minItems", "greater than maxItems");
    std::vector<ExprPtr> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return unsupported(path + ".prefixItems", "expected an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        PAGODA_ASSIGN_OR_RETURN(ExprPtr item, visit(s["prefixItems"][i], fmt::format("{}.prefixItems[{}]", path, i)));
        prefix.push_back(std::move(item));
      }
    }
    ExprPtr item = make_rule_ref("json-value");
    bool more_allowed = true;
    if (s.contains("items")) {
      const auto& items = s["items"];
      if (items.is_boolean() && !items.get<bool>()) {
        more_allowed = false;
      } else if (items.is_array()) {
        return unsupported(path + ".items", "an array of item schemas (draft 4 tuples) is not supported; use prefixItems");
      } else {
        PAGODA_ASSIGN_OR_RETURN(item, visit(items, path + ".items"));
      }
    }
    // The array: the prefix items in order (each may end the array once min is met), then more.
    const size_t p = prefix.size();
    if (max != kUnbounded && max < p) return unsupported(path + ".maxItems", "smaller than the number of prefixItems");
    const uint32_t rest_min = min > p ? min - static_cast<uint32_t>(p) : 0;
    const uint32_t rest_max = !more_allowed ? 0 : max == kUnbounded ? kUnbounded : max - static_cast<uint32_t>(p);
    if (rest_min > rest_max) return unsupported(path + ".minItems", "more items than the schema allows");
    auto element = [&](ExprPtr e) { return make_sequence({std::move(e), make_rule_ref("ws")}); };
    auto comma = [&](ExprPtr e) { return make_sequence({make_literal(","), make_rule_ref("ws"), element(std::move(e))}); };
    // Rest items after at least one written item.
    ExprPtr rest_after = make_repeat(comma(item), rest_min, rest_max);
    // Build from the end: after_k = items k.. of the prefix (each preceded by ","), then rest.
    ExprPtr after = rest_after;
    for (size_t k = p; k-- > 1;) {
      ExprPtr take = make_sequence({comma(prefix[k]), after});
      after = (k + 1 > min) ? make_alternatives({take, make_empty()}) : take;
    }
    ExprPtr body;
    if (p > 0) {
      ExprPtr take = make_sequence({element(prefix[0]), after});
      body = min == 0 ? make_alternatives({take, make_empty()}) : take;
    } else if (rest_max == 0) {
      body = make_empty();
    } else {
      // First rest item without a comma, then rest_min - 1 .. rest_max - 1 more.
      ExprPtr more = make_repeat(comma(item), rest_min > 0 ? rest_min - 1 : 0,
                                 rest_max == kUnbounded ? kUnbounded : rest_max - 1);
      ExprPtr take = make_sequence({element(item), more});
      body = rest_min == 0 ? make_alternatives({take, make_empty()}) : take;
    }
    return make_sequence({make_literal("["), make_rule_ref("ws"), body, make_literal("]")});
  }

  const nlohmann::ordered_json& root_;
  std::string where_;
  std::map<std::string, ExprPtr> rules_;
  std::map<std::string, std::string> ref_rules_;
  int object_count_ = 0;
};

}  // namespace

StatusOr<std::shared_ptr<const Grammar>> json_schema_to_grammar(const nlohmann::ordered_json& schema, std::string_view where) {
  return Converter(schema, std::string(where)).convert(JsonFraming{});
}

StatusOr<std::shared_ptr<const Grammar>> framed_json_schema_grammar(const nlohmann::ordered_json& schema,
                                                                    std::string_view where,
                                                                    const JsonFraming& framing) {
  return Converter(schema, std::string(where)).convert(framing);
}

StatusOr<std::shared_ptr<const Grammar>> json_schema_to_grammar(const nlohmann::json& schema, std::string_view where) {
  return json_schema_to_grammar(nlohmann::ordered_json(schema), where);
}

std::shared_ptr<const Grammar> json_object_grammar() {
  static const std::shared_ptr<const Grammar> grammar = [] {
    auto rules = parse_gbnf_rules(kCommonRules);
    auto value = *std::move(rules);
    value["root"] = make_rule_ref("json-object");
    return *lower_grammar(value, "root");
  }();
  return grammar;
}

}  // namespace pagoda::grammar
