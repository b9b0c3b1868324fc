#include "pagoda/grammar/json_schema_validator.h"

#include <cmath>
#include <set>

#include <fmt/format.h>

#include "pagoda/tokenizer/pcre2_regex.h"

namespace pagoda::grammar {
namespace {

const std::set<std::string> kUnknownAssertions = {
    "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains",
    "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "propertyNames",
    "patternProperties", "$dynamicRef", "$recursiveRef"};

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_integer(const nlohmann::json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d;
}

// JSON equality where 1 and 1.0 are equal.
bool json_equal(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items())
      if (!b.contains(k) || !json_equal(v, b[k])) return false;
    return true;
  }
  return a == b;
}

bool has_type(const nlohmann::json& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") return is_integer(v);
  return false;
}

class Validator {
 public:
  explicit Validator(const nlohmann::json& root) : root_(root) {}

  Status validate(const nlohmann::json& v, const nlohmann::json& s, const std::string& at, const std::string& sp,
                  int depth = 0) {
    if (depth > 256) return invalid_argument_error("{}: schema recursion deeper than 256 ($ref loop?)", at);
    if (s.is_boolean()) {
      if (s.get<bool>()) return ok_status();
      return fail(at, "no value is valid (schema false)", sp);
    }
    if (!s.is_object()) return invalid_argument_error("schema {}: expected an object or a boolean", sp);
    for (const auto& [key, value] : s.items()) {
      if (kUnknownAssertions.contains(key)) {
        return unimplemented_error("schema {}/{}: the validator does not implement \"{}\"", sp, key, key);
      }
    }
    if (s.contains("$ref")) {
      PAGODA_ASSIGN_OR_RETURN(const nlohmann::json* target, resolve(s["$ref"], sp));
      PAGODA_RETURN_IF_ERROR(validate(v, *target, at, s["$ref"].get<std::string>(), depth + 1));
    }
    if (s.contains("type")) {
      const auto& type = s["type"];
      bool ok = false;
      if (type.is_string()) ok = has_type(v, type.get<std::string>());
      for (const auto& t : type.is_array() ? type : nlohmann::json::array())
        if (t.is_string() && has_type(v, t.get<std::string>())) ok = true;
      if (!ok) return fail(at, fmt::format("{} is not of type {}", v.dump(), type.dump()), sp + "/type");
    }
    if (s.contains("const") && !json_equal(v, s["const"])) {
      return fail(at, fmt::format("{} is not the const {}", v.dump(), s["const"].dump()), sp + "/const");
    }
    if (s.contains("enum")) {
      bool found = false;
      for (const auto& option : s["enum"]) found = found || json_equal(v, option);
      if (!found) return fail(at, fmt::format("{} is not one of {}", v.dump(), s["enum"].dump()), sp + "/enum");
    }
    if (s.contains("allOf")) {
      for (size_t i = 0; i < s["allOf"].size(); ++i)
        PAGODA_RETURN_IF_ERROR(validate(v, s["allOf"][i], at, fmt::format("{}/allOf/{}", sp, i), depth + 1));
    }
    if (s.contains("anyOf")) {
      bool any = false;
      for (size_t i = 0; i < s["anyOf"].size() && !any; ++i) {
        Status st = validate(v, s["anyOf"][i], at, fmt::format("{}/anyOf/{}", sp, i), depth + 1);
        if (st.code() == StatusCode::kUnimplemented) return st;
        any = st.ok();
      }
      if (!any) return fail(at, "matches no anyOf branch", sp + "/anyOf");
    }
    if (s.contains("oneOf")) {
      int matches = 0;
      for (size_t i = 0; i < s["oneOf"].size(); ++i) {
        Status st = validate(v, s["oneOf"][i], at, fmt::format("{}/oneOf/{}", sp, i), depth + 1);
        if (st.code() == StatusCode::kUnimplemented) return st;
        matches += st.ok();
      }
      if (matches != 1) return fail(at, fmt::format("matches {} oneOf branches, not 1", matches), sp + "/oneOf");
    }
    if (s.contains("not")) {
      Status st = validate(v, s["not"], at, sp + "/not", depth + 1);
      if (st.code() == StatusCode::kUnimplemented) return st;
      if (st.ok()) return fail(at, "matches the \"not\" schema", sp + "/not");
    }
    if (v.is_number()) PAGODA_RETURN_IF_ERROR(validate_number(v, s, at, sp));
    if (v.is_string()) PAGODA_RETURN_IF_ERROR(validate_string(v, s, at, sp));
    if (v.is_array()) PAGODA_RETURN_IF_ERROR(validate_array(v, s, at, sp, depth));
    if (v.is_object()) PAGODA_RETURN_IF_ERROR(validate_object(v, s, at, sp, depth));
    return ok_status();
  }

 private:
  static Status fail(const std::string& at, const std::string& what, const std::string& sp) {
    return invalid_argument_error("{}: {} (schema {})", at, what, sp);
  }

  StatusOr<const nlohmann::json*> resolve(const nlohmann::json& ref, const std::string& sp) const {
    if (!ref.is_string()) return invalid_argument_error("schema {}/$ref: expected a string", sp);
    const std::string target = ref.get<std::string>();
    if (target != "#" && !target.starts_with("#/")) {
      return unimplemented_error("schema {}/$ref: only \"#...\" references are supported, got \"{}\"", sp, target);
    }
    const nlohmann::json* node = &root_;
    size_t pos = 1;
    while (pos < target.size()) {
      const size_t next = target.find('/', pos + 1);
      std::string token = target.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
      for (size_t p; (p = token.find("~1")) != std::string::npos;) token.replace(p, 2, "/");
      for (size_t p; (p = token.find("~0")) != std::string::npos;) token.replace(p, 2, "~");
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        return invalid_argument_error("schema {}/$ref: \"{}\" does not resolve", sp, target);
      }
      if (next == std::string::npos) break;
      pos = next;
    }
    return node;
  }

  Status validate_number(const nlohmann::json& v, const nlohmann::json& s, const std::string& at, const std::string& sp) {
    const double x = v.get<double>();
    auto bound = [&](const char* key) -> std::optional<double> {
      if (s.contains(key) && s[key].is_number()) return s[key].get<double>();
      return std::nullopt;
    };
    if (auto m = bound("minimum"); m && x < *m) return fail(at, fmt::format("{} is below minimum {}", v.dump(), *m), sp + "/minimum");
    if (auto m = bound("maximum"); m && x > *m) return fail(at, fmt::format("{} is above maximum {}", v.dump(), *m), sp + "/maximum");
    if (auto m = bound("exclusiveMinimum"); m && x <= *m) return fail(at, fmt::format("{} is not above {}", v.dump(), *m), sp + "/exclusiveMinimum");
    if (auto m = bound("exclusiveMaximum"); m && x >= *m) return fail(at, fmt::format("{} is not below {}", v.dump(), *m), sp + "/exclusiveMaximum");
    if (auto m = bound("multipleOf"); m && *m > 0) {
      const double q = x / *m;
      if (!std::isfinite(q) || std::fabs(q - std::round(q)) > 1e-9 * std::max(1.0, std::fabs(q))) {
        return fail(at, fmt::format("{} is not a multiple of {}", v.dump(), *m), sp + "/multipleOf");
      }
    }
    return ok_status();
  }

  Status validate_string(const nlohmann::json& v, const nlohmann::json& s, const std::string& at, const std::string& sp) {
    const std::string& text = v.get_ref<const std::string&>();
    const size_t length = code_points(text);
    if (s.contains("minLength") && length < s["minLength"].get<size_t>())
      return fail(at, fmt::format("length {} is below minLength {}", length, s["minLength"].dump()), sp + "/minLength");
    if (s.contains("maxLength") && length > s["maxLength"].get<size_t>())
      return fail(at, fmt::format("length {} is above maxLength {}", length, s["maxLength"].dump()), sp + "/maxLength");
    if (s.contains("pattern") && s["pattern"].is_string()) {
      auto regex = tokenizer::Pcre2Regex::compile(s["pattern"].get<std::string>());
      if (!regex.ok()) return invalid_argument_error("schema {}/pattern: {}", sp, regex.status().message());
      size_t b = 0, e = 0;
      if (!regex->find(text, 0, b, e)) {
        return fail(at, fmt::format("{} does not match pattern {}", v.dump(), s["pattern"].dump()), sp + "/pattern");
      }
    }
    return ok_status();
  }

  Status validate_array(const nlohmann::json& v, const nlohmann::json& s, const std::string& at, const std::string& sp,
                        int depth) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>())
      return fail(at, fmt::format("{} items, below minItems {}", v.size(), s["minItems"].dump()), sp + "/minItems");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>())
      return fail(at, fmt::format("{} items, above maxItems {}", v.size(), s["maxItems"].dump()), sp + "/maxItems");
    if (s.value("uniqueItems", false)) {
      for (size_t i = 0; i < v.size(); ++i)
        for (size_t j = i + 1; j < v.size(); ++j)
          if (json_equal(v[i], v[j])) return fail(at, fmt::format("items {} and {} are equal", i, j), sp + "/uniqueItems");
    }
    size_t prefix = 0;
    if (s.contains("prefixItems") && s["prefixItems"].is_array()) {
      prefix = s["prefixItems"].size();
      for (size_t i = 0; i < v.size() && i < prefix; ++i)
        PAGODA_RETURN_IF_ERROR(validate(v[i], s["prefixItems"][i], fmt::format("{}[{}]", at, i),
                                        fmt::format("{}/prefixItems/{}", sp, i), depth + 1));
    }
    if (s.contains("items")) {
      if (s["items"].is_array()) return unimplemented_error("schema {}/items: arrays of schemas (draft 4) are not implemented", sp);
      for (size_t i = prefix; i < v.size(); ++i)
        PAGODA_RETURN_IF_ERROR(validate(v[i], s["items"], fmt::format("{}[{}]", at, i), sp + "/items", depth + 1));
    }
    return ok_status();
  }

  Status validate_object(const nlohmann::json& v, const nlohmann::json& s, const std::string& at, const std::string& sp,
                         int depth) {
    if (s.contains("minProperties") && v.size() < s["minProperties"].get<size_t>())
      return fail(at, fmt::format("{} properties, below minProperties", v.size()), sp + "/minProperties");
    if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>())
      return fail(at, fmt::format("{} properties, above maxProperties", v.size()), sp + "/maxProperties");
    if (s.contains("required")) {
      for (const auto& name : s["required"])
        if (name.is_string() && !v.contains(name.get<std::string>()))
          return fail(at, fmt::format("required property {} is missing", name.dump()), sp + "/required");
    }
    const nlohmann::json empty = nlohmann::json::object();
    const nlohmann::json& properties = s.contains("properties") ? s["properties"] : empty;
    for (const auto& [key, value] : v.items()) {
      const std::string child = fmt::format("{}.{}", at, key);
      if (properties.contains(key)) {
        PAGODA_RETURN_IF_ERROR(validate(value, properties[key], child, sp + "/properties/" + key, depth + 1));
      } else if (s.contains("additionalProperties")) {
        PAGODA_RETURN_IF_ERROR(validate(value, s["additionalProperties"], child, sp + "/additionalProperties", depth + 1));
      }
    }
    return ok_status();
  }

  const nlohmann::json& root_;
};

}  // namespace

Status validate_json_schema(const nlohmann::json& instance, const nlohmann::json& schema) {
  return Validator(schema).validate(instance, schema, "$", "#");
}

}  // namespace pagoda::grammar
