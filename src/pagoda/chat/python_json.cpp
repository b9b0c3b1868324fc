#include "pagoda/chat/python_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {
namespace {

constexpr int kMaxDepth = 512;

void append_hex4(std::string& out, unsigned value) {
  char escape[16];
  std::snprintf(escape, sizeof(escape), "\\u%04x", value);
  out += escape;
}

void append_json_string(std::string& out, const std::string& text, bool ensure_ascii) {
  out.push_back('"');
  size_t offset = 0;
  while (offset < text.size()) {
    const unsigned char byte = static_cast<unsigned char>(text[offset]);
    if (byte < 0x80) {
      switch (byte) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (byte < 0x20) {
            append_hex4(out, byte);
          } else {
            out.push_back(static_cast<char>(byte));
          }
      }
      ++offset;
      continue;
    }
    size_t length = 1;
    const char32_t c = decode_utf8_at(text, offset, &length);
    if (!ensure_ascii) {
      out.append(text, offset, length);
    } else if (c < 0x10000) {
      append_hex4(out, static_cast<unsigned>(c));
    } else {  // a surrogate pair, as Python writes astral code points
      const char32_t v = c - 0x10000;
      append_hex4(out, 0xD800 + static_cast<unsigned>(v >> 10));
      append_hex4(out, 0xDC00 + static_cast<unsigned>(v & 0x3FF));
    }
    offset += length;
  }
  out.push_back('"');
}

std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return format_python_float(value);
}

class Dumper {
 public:
  explicit Dumper(const PythonJsonOptions& options) : options_(options) {
    item_separator_ = options.item_separator.value_or(options.indent ? "," : ", ");
    key_separator_ = options.key_separator.value_or(": ");
  }

  Status dump(const Value& value, int depth, std::string& out) {
    if (depth > kMaxDepth) return invalid_argument_error("tojson: nesting deeper than {} levels (circular reference?)", kMaxDepth);
    // a list that repeats one long string (or a long indent) writes far more than it holds
    const size_t bytes = value.is_string() ? value.as_string().size() : 16;
    if (!WorkMeter::spend(bytes)) return WorkMeter::exhausted_error();
    switch (value.kind()) {
      case Value::Kind::kNone: out += "null"; return ok_status();
      case Value::Kind::kBool: out += value.as_bool() ? "true" : "false"; return ok_status();
      case Value::Kind::kInt: out += std::to_string(value.as_int()); return ok_status();
      case Value::Kind::kFloat: out += json_float(value.as_double()); return ok_status();
      case Value::Kind::kString: append_json_string(out, value.as_string(), options_.ensure_ascii); return ok_status();
      case Value::Kind::kList: return dump_list(value.as_list()->items, depth, out);
      case Value::Kind::kDict:
        if (!value.as_dict()->is_namespace) return dump_dict(*value.as_dict(), depth, out);
        break;
      default:
        break;
    }
    return invalid_argument_error("Object of type {} is not JSON serializable", type_name(value));
  }

 private:
  void newline(int depth, std::string& out) const {
    out.push_back('\n');
    if (!WorkMeter::spend(static_cast<uint64_t>(depth) * options_.indent->size())) return;  // dump() then fails
    for (int i = 0; i < depth; ++i) out += *options_.indent;
  }

  Status dump_list(const std::vector<Value>& items, int depth, std::string& out) {
    if (items.empty()) {
      out += "[]";
      return ok_status();
    }
    out.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_separator_;
      if (options_.indent) newline(depth + 1, out);
      PAGODA_RETURN_IF_ERROR(dump(items[i], depth + 1, out));
    }
    if (options_.indent) newline(depth, out);
    out.push_back(']');
    return ok_status();
  }

  // Python converts non-string keys: 1 -> "1", 1.5 -> "1.5", True -> "true", None -> "null".
  static StatusOr<std::string> key_text(const Value& key) {
    switch (key.kind()) {
      case Value::Kind::kString: return key.as_string();
      case Value::Kind::kBool: return std::string(key.as_bool() ? "true" : "false");
      case Value::Kind::kInt: return std::to_string(key.as_int());
      case Value::Kind::kFloat: return json_float(key.as_double());
      case Value::Kind::kNone: return std::string("null");
      default:
        return invalid_argument_error("keys must be str, int, float, bool or None, not {}", type_name(key));
    }
  }

  Status dump_dict(const Dict& dict, int depth, std::string& out) {
    if (dict.size() == 0) {
      out += "{}";
      return ok_status();
    }
    std::vector<std::pair<std::string, const Value*>> entries;
    entries.reserve(dict.size());
    for (const auto& [key, item] : dict.entries()) {
      PAGODA_ASSIGN_OR_RETURN(std::string text, key_text(key));
      entries.emplace_back(std::move(text), &item);
    }
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out += item_separator_;
      if (options_.indent) newline(depth + 1, out);
      append_json_string(out, entries[i].first, options_.ensure_ascii);
      out += key_separator_;
      PAGODA_RETURN_IF_ERROR(dump(*entries[i].second, depth + 1, out));
    }
    if (options_.indent) newline(depth, out);
    out.push_back('}');
    return ok_status();
  }

  const PythonJsonOptions& options_;
  std::string item_separator_;
  std::string key_separator_;
};

}  // namespace

StatusOr<std::string> python_json_dumps(const Value& value, const PythonJsonOptions& options) {
  std::string out;
  Dumper dumper(options);
  PAGODA_RETURN_IF_ERROR(dumper.dump(value, 0, out));
  return out;
}

}  // namespace pagoda::chat
