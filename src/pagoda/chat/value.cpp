#include "pagoda/chat/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include <utf8proc.h>

#include "pagoda/chat/unicode_text.h"

namespace pagoda::chat {

// ---- Dict ----------------------------------------------------------------------------------

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  const std::optional<std::string> hashed = hash_key(key);
  if (!hashed) return nullptr;
  const auto it = other_index_.find(*hashed);
  return it == other_index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(std::string_view key) const {
  const auto it = string_index_.find(key);
  return it == string_index_.end() ? nullptr : &entries_[it->second].second;
}

Status Dict::set_item(Value key, Value value) {
  size_t position = entries_.size();
  bool inserted = false;
  if (key.is_string()) {
    const auto [it, fresh] = string_index_.emplace(key.as_string(), entries_.size());
    position = it->second;
    inserted = fresh;
  } else {
    std::optional<std::string> hashed = hash_key(key);
    if (!hashed) return invalid_argument_error("unhashable type: '{}'", type_name(key));
    const auto [it, fresh] = other_index_.emplace(std::move(*hashed), entries_.size());
    position = it->second;
    inserted = fresh;
  }
  depth_ = std::max(depth_, 1 + std::max(nesting_depth(key), nesting_depth(value)));
  if (inserted) {
    entries_.emplace_back(std::move(key), std::move(value));
  } else {
    entries_[position].second = std::move(value);  // Python keeps the first key and position
  }
  return ok_status();
}

void Dict::set(std::string_view key, Value value) {
  (void)set_item(Value(key), std::move(value));  // a string key is always hashable
}

// ---- Value ---------------------------------------------------------------------------------

Value Value::undefined(std::string hint) {
  Value v;
  v.data_ = Undefined{std::make_shared<const std::string>(std::move(hint))};
  return v;
}

namespace {
thread_local RenderArena* current_arena = nullptr;
thread_local WorkMeter* current_meter = nullptr;
constexpr uint64_t kItemCost = 16;  // work bytes for visiting one list item or dict entry
}  // namespace

WorkMeter::WorkMeter(uint64_t allowance) : previous_(current_meter), allowance_(allowance) { current_meter = this; }

WorkMeter::~WorkMeter() { current_meter = previous_; }

bool WorkMeter::spend(uint64_t bytes) {
  WorkMeter* meter = current_meter;
  if (meter == nullptr) return true;
  meter->spent_ = bytes > meter->allowance_ - std::min(meter->spent_, meter->allowance_) ? meter->allowance_ + 1
                                                                                        : meter->spent_ + bytes;
  return meter->spent_ <= meter->allowance_;
}

Status WorkMeter::exhausted_error() {
  const uint64_t allowance = current_meter ? current_meter->allowance_ : 0;
  return resource_exhausted_error("the template did more than {} bytes of work (runaway template?)", allowance);
}

Value::Value(std::shared_ptr<List> v) : data_(v) { RenderArena::track(v); }
Value::Value(std::shared_ptr<Dict> v) : data_(v) { RenderArena::track(v); }
Value::Value(std::shared_ptr<Callable> v) : data_(v) { RenderArena::track(v); }
Value::Value(std::shared_ptr<LoopState> v) : data_(v) { RenderArena::track(v); }

RenderArena::RenderArena() {
  if (current_arena == nullptr) {
    current_arena = this;
    outermost_ = true;
  }
}

RenderArena::~RenderArena() {
  if (!outermost_) return;
  current_arena = nullptr;  // what the clearing destroys is not tracked again
  // Every container is still held here, so emptying one destroys no other.
  for (auto& d : dicts_) d->clear();
  for (auto& l : lists_) l->items.clear();
  for (auto& c : callables_) c->invoke = nullptr;
  for (auto& l : loops_) {
    l->items.reset();
    l->last_changed.reset();
  }
}

// Each container held costs about this much memory until the render ends; the meter is charged
// for it so that what the arena keeps alive stays within the render's work limit (the items are
// charged where they are built).
constexpr uint64_t kHeldContainerCost = 128;

void RenderArena::track(const std::shared_ptr<List>& v) {
  if (!current_arena || !v) return;
  current_arena->lists_.push_back(v);
  WorkMeter::spend(kHeldContainerCost);
}
void RenderArena::track(const std::shared_ptr<Dict>& v) {
  if (!current_arena || !v) return;
  current_arena->dicts_.push_back(v);
  WorkMeter::spend(kHeldContainerCost);
}
void RenderArena::track(const std::shared_ptr<Callable>& v) {
  if (!current_arena || !v) return;
  current_arena->callables_.push_back(v);
  WorkMeter::spend(kHeldContainerCost);
}
void RenderArena::track(const std::shared_ptr<LoopState>& v) {
  if (!current_arena || !v) return;
  current_arena->loops_.push_back(v);
  WorkMeter::spend(kHeldContainerCost);
}

void Dict::clear() {
  // Moved out first: destroying the entries may reach this dict again.
  auto entries = std::move(entries_);
  entries_.clear();
  depth_ = 1;
  string_index_.clear();
  other_index_.clear();
}

namespace {

std::shared_ptr<List> make_list(std::vector<Value> items, bool is_tuple) {
  auto list = std::make_shared<List>();
  for (const Value& item : items) list->depth = std::max(list->depth, 1 + nesting_depth(item));
  list->items = std::move(items);
  list->is_tuple = is_tuple;
  return list;
}

}  // namespace

Value Value::list(std::vector<Value> items) { return Value(make_list(std::move(items), false)); }

Value Value::tuple(std::vector<Value> items) { return Value(make_list(std::move(items), true)); }

size_t nesting_depth(const Value& value) {
  if (value.is_list()) return value.as_list()->depth;
  if (value.is_dict() && !value.as_dict()->is_namespace) return value.as_dict()->depth();
  return 0;
}

Value Value::callable(std::string name,
                      std::function<StatusOr<Value>(Interpreter&, CallArgs&)> invoke) {
  auto callable = std::make_shared<Callable>();
  callable->name = std::move(name);
  callable->invoke = std::move(invoke);
  return Value(std::move(callable));
}

std::string Value::undefined_hint() const {
  const auto& hint = std::get<Undefined>(data_).hint;
  return hint && !hint->empty() ? *hint : "a value is undefined";
}

// ---- Python semantics ----------------------------------------------------------------------

bool is_truthy(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return value.as_bool();
    case Value::Kind::kInt:
      return value.as_int() != 0;
    case Value::Kind::kFloat:
      return value.as_double() != 0.0;
    case Value::Kind::kString:
      return !value.as_string().empty();
    case Value::Kind::kList:
      return !value.as_list()->items.empty();
    case Value::Kind::kDict:
      return value.as_dict()->is_namespace || value.as_dict()->size() != 0;
    case Value::Kind::kCallable:
    case Value::Kind::kLoop:
      return true;
  }
  return false;
}

std::string type_name(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return value.as_list()->is_tuple ? "tuple" : "list";
    case Value::Kind::kDict: return value.as_dict()->is_namespace ? "Namespace" : "dict";
    case Value::Kind::kCallable: return "function";
    case Value::Kind::kLoop: return "LoopContext";
  }
  return "object";
}

std::string object_description(const Value& value) {
  return "'" + type_name(value) + " object'";
}

std::string format_python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  char buffer[64];
  // shortest round-trip digits, in d.ddde+XX form, then laid out the way repr() does
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  const size_t e = scientific.find('e');
  std::string mantissa = scientific.substr(0, e);
  const int exponent = std::stoi(scientific.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {  // repr uses fixed notation for 1e-4 <= |x| < 1e16
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
             digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof(exponent_text), "e%c%02d", exponent < 0 ? '-' : '+',
                exponent < 0 ? -exponent : exponent);
  return out + exponent_text;
}

namespace {

bool is_python_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string repr_string(const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 1;
    const char32_t c = decode_utf8_at(text, offset, &length);
    const bool invalid_byte = c == 0xFFFD && length == 1 && static_cast<unsigned char>(text[offset]) >= 0x80;
    if (invalid_byte) {
      out.push_back(text[offset]);  // Python strings cannot hold these; keep the byte
    } else if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_python_printable(c)) {
      char escape[16];
      if (c < 0x100) {
        std::snprintf(escape, sizeof(escape), "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(escape, sizeof(escape), "\\U%08x", static_cast<unsigned>(c));
      }
      out += escape;
    } else {
      out.append(text, offset, length);
    }
    offset += length;
  }
  out.push_back(quote);
  return out;
}

// Values nest at most this deep when printed; deeper means a namespace that contains itself.
constexpr int kMaxPrintDepth = 256;

std::string repr_at_depth(const Value& value, int depth);

}  // namespace

std::string to_python_repr(const Value& value) { return repr_at_depth(value, 0); }

namespace {

std::string repr_at_depth(const Value& value, int depth) {
  if (depth > kMaxPrintDepth) return "...";
  switch (value.kind()) {
    case Value::Kind::kString:
      if (!WorkMeter::spend(value.as_string().size())) return "";
      return repr_string(value.as_string());
    case Value::Kind::kList: {
      const List& list = *value.as_list();
      if (!WorkMeter::spend(list.items.size() * kItemCost)) return "";
      std::string out = list.is_tuple ? "(" : "[";
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += repr_at_depth(list.items[i], depth + 1);
      }
      if (list.is_tuple && list.items.size() == 1) out += ",";
      out += list.is_tuple ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      const Dict& dict = *value.as_dict();
      if (!WorkMeter::spend(dict.size() * kItemCost)) return "";
      std::string out = dict.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, item] : dict.entries()) {
        if (!first) out += ", ";
        first = false;
        out += repr_at_depth(key, depth + 1) + ": " + repr_at_depth(item, depth + 1);
      }
      out += dict.is_namespace ? "}>" : "}";
      return out;
    }
    case Value::Kind::kUndefined:
      return "Undefined";  // repr(jinja2.Undefined()), seen when a list holding one is printed
    default:
      return to_python_str(value);
  }
}

}  // namespace

std::string to_python_str(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return value.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(value.as_int());
    case Value::Kind::kFloat: return format_python_float(value.as_double());
    case Value::Kind::kString: return WorkMeter::spend(value.as_string().size()) ? value.as_string() : std::string();
    case Value::Kind::kList:
    case Value::Kind::kDict: return to_python_repr(value);
    case Value::Kind::kCallable: return "<function " + value.as_callable()->name + ">";
    case Value::Kind::kLoop: return "<LoopContext>";
  }
  return "";
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString: {
      const std::string& x = a.as_string();
      const std::string& y = b.as_string();
      if (&x == &y) return true;
      return x.size() == y.size() && WorkMeter::spend(x.size()) && x == y;
    }
    case Value::Kind::kList: {
      if (a.as_list() == b.as_list()) return true;
      const List& x = *a.as_list();
      const List& y = *b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      if (!WorkMeter::spend(x.items.size() * kItemCost)) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!values_equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = *a.as_dict();
      const Dict& y = *b.as_dict();
      if (x.is_namespace || y.is_namespace || a.as_dict() == b.as_dict()) return a.as_dict() == b.as_dict();
      if (x.size() != y.size() || !WorkMeter::spend(x.size() * kItemCost)) return false;
      for (const auto& [key, item] : x.entries()) {
        const Value* other = y.find(key);
        if (other == nullptr || !values_equal(item, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.as_callable() == b.as_callable();
    case Value::Kind::kLoop:
      return a.as_loop() == b.as_loop();
    default:
      return false;
  }
}

StatusOr<int> compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
    }
    const double x = a.as_double();
    const double y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    if (!WorkMeter::spend(std::min(a.as_string().size(), b.as_string().size()))) return WorkMeter::exhausted_error();
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.as_list()->is_tuple == b.as_list()->is_tuple) {
    const auto& x = a.as_list()->items;
    const auto& y = b.as_list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      if (WorkMeter::exhausted()) return WorkMeter::exhausted_error();
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return invalid_argument_error("'<' not supported between instances of '{}' and '{}'",
                                type_name(a), type_name(b));
}

std::optional<std::string> hash_key(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kString:
      if (!WorkMeter::spend(value.as_string().size())) return std::nullopt;
      return "s" + value.as_string();
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return "n" + std::to_string(value.as_int());
    case Value::Kind::kFloat: {
      const double d = value.as_double();
      // 1.0 hashes like 1, as in Python
      if (std::floor(d) == d && std::fabs(d) < 9.0e18) return "n" + std::to_string(static_cast<int64_t>(d));
      return "f" + format_python_float(d);
    }
    case Value::Kind::kNone:
      return std::string("N");
    case Value::Kind::kList: {
      if (!value.as_list()->is_tuple || !WorkMeter::spend(value.as_list()->items.size() * kItemCost)) return std::nullopt;
      std::string out = "t(";
      for (const Value& item : value.as_list()->items) {
        std::optional<std::string> inner = hash_key(item);
        if (!inner) return std::nullopt;
        out += std::to_string(inner->size()) + ":" + *inner;
      }
      return out + ")";
    }
    default:
      return std::nullopt;
  }
}

StatusOr<std::vector<Value>> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>{};
    case Value::Kind::kList:
      if (!WorkMeter::spend(value.as_list()->items.size() * kItemCost)) return WorkMeter::exhausted_error();
      return value.as_list()->items;
    case Value::Kind::kDict: {
      if (value.as_dict()->is_namespace) break;
      if (!WorkMeter::spend(value.as_dict()->size() * kItemCost)) return WorkMeter::exhausted_error();
      std::vector<Value> keys;
      keys.reserve(value.as_dict()->size());
      for (const auto& entry : value.as_dict()->entries()) keys.push_back(entry.first);
      return keys;
    }
    case Value::Kind::kString: {
      const std::string& text = value.as_string();
      if (!WorkMeter::spend(text.size() * kItemCost)) return WorkMeter::exhausted_error();
      const std::vector<size_t> offsets = code_point_offsets(text);
      std::vector<Value> characters;
      characters.reserve(offsets.size() - 1);
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        characters.emplace_back(std::string_view(text).substr(offsets[i], offsets[i + 1] - offsets[i]));
      }
      return characters;
    }
    default:
      break;
  }
  return invalid_argument_error("'{}' object is not iterable", type_name(value));
}

namespace {

template <typename Json>
Value value_from_any_json(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = json.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(json.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(value_from_any_json(item));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (auto it = json.begin(); it != json.end(); ++it) dict->set(it.key(), value_from_any_json(it.value()));
      return Value(std::move(dict));
    }
    default:  // binary, discarded
      return Value::none();
  }
}

}  // namespace

Value value_from_json(const nlohmann::ordered_json& json) { return value_from_any_json(json); }
Value value_from_json(const nlohmann::json& json) { return value_from_any_json(json); }

}  // namespace pagoda::chat
