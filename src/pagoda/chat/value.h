#pragma once
// Value: the dynamic value a chat template computes with, modelled on the Python objects that
// Jinja2 handles inside transformers (str, int, float, bool, None, list, tuple, dict, Jinja's
// Undefined, namespace(), callables and the `loop` object), so that truthiness, equality,
// str()/repr() and ordering behave exactly as they do there.
//
// Strings are UTF-8 and shared (copying a Value never copies text). Lists and dicts are shared
// too: templates cannot mutate them (transformers uses Jinja's immutable sandbox); only
// namespace() objects are written, through `{% set ns.attr = ... %}`, and those are shared by
// reference as in Python.
//
// Thread safety: a Value may be read from several threads; the render that owns a namespace
// is its only writer.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/core/status.h"

namespace pagoda::chat {

class Value;
class Interpreter;

// Jinja's Undefined: falsy, prints as "", iterates as empty; using it in most other ways is an
// error whose text is `hint` (e.g. "'x' is undefined").
struct Undefined {
  std::shared_ptr<const std::string> hint;
};
struct NoneValue {};

struct List;
class Dict;
struct Callable;
struct CallArgs;
struct LoopState;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable, kLoop };

  Value() : data_(Undefined{}) {}  // undefined
  Value(bool v) : data_(v) {}       // NOLINT: implicit, like Python literals
  Value(int v) : data_(static_cast<int64_t>(v)) {}  // NOLINT
  Value(int64_t v) : data_(v) {}    // NOLINT
  Value(double v) : data_(v) {}     // NOLINT
  Value(std::string v) : data_(std::make_shared<const std::string>(std::move(v))) {}  // NOLINT
  Value(std::string_view v) : Value(std::string(v)) {}  // NOLINT
  Value(const char* v) : Value(std::string(v)) {}       // NOLINT
  // Containers are registered with the thread's RenderArena, if one is active.
  Value(std::shared_ptr<List> v);       // NOLINT
  Value(std::shared_ptr<Dict> v);       // NOLINT
  Value(std::shared_ptr<Callable> v);   // NOLINT
  Value(std::shared_ptr<LoopState> v);  // NOLINT

  static Value none() { Value v; v.data_ = NoneValue{}; return v; }
  static Value undefined(std::string hint);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value dict() { return Value(std::make_shared<Dict>()); }
  static Value callable(std::string name,
                        std::function<StatusOr<Value>(Interpreter&, CallArgs&)> invoke);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // bool counts as a number, as in Python (True + 1 == 2).
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_callable() const { return kind() == Kind::kCallable; }
  bool is_loop() const { return kind() == Kind::kLoop; }

  bool as_bool() const { return std::get<bool>(data_); }
  // Only for is_integral().
  int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(data_); }
  // Only for is_number().
  double as_double() const { return is_float() ? std::get<double>(data_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(data_); }
  const std::shared_ptr<List>& as_list() const { return std::get<std::shared_ptr<List>>(data_); }
  const std::shared_ptr<Dict>& as_dict() const { return std::get<std::shared_ptr<Dict>>(data_); }
  const std::shared_ptr<Callable>& as_callable() const { return std::get<std::shared_ptr<Callable>>(data_); }
  const std::shared_ptr<LoopState>& as_loop() const { return std::get<std::shared_ptr<LoopState>>(data_); }
  // The message for misuse of an undefined value ("'x' is undefined").
  std::string undefined_hint() const;

 private:
  std::variant<Undefined, NoneValue, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<Callable>,
               std::shared_ptr<LoopState>>
      data_;
};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;  // prints as (a, b) and is hashable
  size_t depth = 1;       // nesting_depth(): set by Value::list / Value::tuple (lists never change after)
};

// An insertion-ordered dict (Python 3.7+ order), keyed by hashable scalars (str, int, float,
// bool, None, tuples of those). Namespaces are dicts whose keys are set with attribute syntax.
class Dict {
 public:
  bool is_namespace = false;

  // nullptr when absent.
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or overwrites (keeping the first position, as Python does). Fails on an
  // unhashable key (list, dict).
  Status set_item(Value key, Value value);
  void set(std::string_view key, Value value);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  // nesting_depth() of the deepest key or value ever set, plus one.
  size_t depth() const { return depth_; }
  void clear();

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  std::vector<std::pair<Value, Value>> entries_;
  size_t depth_ = 1;
  // position in entries_: string keys by their text (looked up without allocating), other keys
  // by hash_key()
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> string_index_;
  std::unordered_map<std::string, size_t> other_index_;
};

// Arguments of a call, a filter or a test, after the subject: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A function a template can call: globals (range, namespace, raise_exception), bound methods
// ('x'.split), macros and loop.cycle.
struct Callable {
  std::string name;  // for error messages: "range", "str.split", "macro 'render_tool'"
  std::function<StatusOr<Value>(Interpreter&, CallArgs&)> invoke;
};

// The `loop` variable inside a for loop.
struct LoopState {
  std::shared_ptr<const List> items;  // the items iterated (after the loop's `if` filter)
  size_t index0 = 0;
  size_t depth0 = 0;
  std::optional<Value> last_changed;  // loop.changed() memory
  bool has_last_changed = false;
};


// Every container (list, dict, namespace, callable, loop state) that becomes a
// Value while an arena is active on this thread is held until the arena ends;
// then all are emptied before any is released. A template can build reference
// cycles ({% set ns.me = ns %}, a list holding itself); emptying breaks them,
// so a render never leaks. Holding them also means no container is destroyed
// mid-render, where dropping the head of a long chain (namespaces linked
// through a loop) would destroy it recursively and overflow the stack: at the
// end each is emptied while every other is still held, so no destruction
// recurses. What that keeps alive is bounded by RenderLimits::max_work_bytes.
// Nothing a render made outlives it (it returns text).
// Nested arenas on one thread: only the outermost one acts.
// Thread safety: per thread.
class RenderArena {
 public:
  RenderArena();
  ~RenderArena();
  RenderArena(const RenderArena&) = delete;
  RenderArena& operator=(const RenderArena&) = delete;

  static void track(const std::shared_ptr<List>& v);
  static void track(const std::shared_ptr<Dict>& v);
  static void track(const std::shared_ptr<Callable>& v);
  static void track(const std::shared_ptr<LoopState>& v);

 private:
  bool outermost_ = false;
  std::vector<std::shared_ptr<List>> lists_;
  std::vector<std::shared_ptr<Dict>> dicts_;
  std::vector<std::shared_ptr<Callable>> callables_;
  std::vector<std::shared_ptr<LoopState>> loops_;
};

// A render's allowance of work, in bytes: what it builds, scans and prints. The interpreter
// installs one per render and charges it for the values expressions build and the operands
// they scan; the functions below that walk values (==, <, hash_key, str / repr, iterate) and
// tojson charge it as they go, because one call on values that share their items
// ([s] * n == [t] * n, sorting them) can touch far more bytes than the values hold. Once the
// allowance is spent those functions stop early with a partial answer and the interpreter,
// which checks the meter after every expression, fails the render with kResourceExhausted:
// nothing computed past that point reaches the prompt. Outside a render nothing is counted.
// Thread safety: per thread, like RenderArena; meters nest (the innermost counts).
class WorkMeter {
 public:
  explicit WorkMeter(uint64_t allowance);
  ~WorkMeter();
  WorkMeter(const WorkMeter&) = delete;
  WorkMeter& operator=(const WorkMeter&) = delete;

  // Adds bytes to this thread's meter: false once its allowance is spent.
  static bool spend(uint64_t bytes);
  static bool exhausted() { return !spend(0); }
  // The error a render fails with once the meter is spent.
  static Status exhausted_error();

 private:
  WorkMeter* previous_;
  uint64_t allowance_;
  uint64_t spent_ = 0;
};

// Python's bool(x); Undefined is false.
bool is_truthy(const Value& value);
// Python's type(x).__name__ ("str", "int", "list", "dict", "NoneType", "Undefined", ...).
std::string type_name(const Value& value);
// Jinja's "'dict object'" / "'str object'" wording, used in attribute errors.
std::string object_description(const Value& value);

// Python's str(x) (what {{ x }} prints) and repr(x). Undefined prints as "".
std::string to_python_str(const Value& value);
std::string to_python_repr(const Value& value);
// repr(float): shortest round-trip digits, "1e-05" / "1e+16" exponents, "2.0", "inf", "nan".
std::string format_python_float(double value);

// Python ==: 1 == 1.0 == True; lists and dicts compare element-wise (a list, dict or string
// equals itself without a scan, as Python's identity shortcut does); Undefined equals only
// Undefined.
bool values_equal(const Value& a, const Value& b);
// Python <, for sort/min/max and comparisons: numbers with numbers, strings by code point,
// lists/tuples lexicographically. -1, 0, 1; an error names the two types otherwise.
StatusOr<int> compare_values(const Value& a, const Value& b);

// The dict key a hashable value maps to; nullopt for unhashable values (list, dict).
std::optional<std::string> hash_key(const Value& value);

// How deep the recursive functions here (==, <, hash_key) descend into a value: 0 for
// scalars, callables and namespaces (compared by identity, never hashed), 1 for an empty list
// or dict, 1 + the deepest item otherwise. Lists and plain dicts never change once built, so
// the depth recorded at construction stays exact; the interpreter refuses values deeper than
// kMaxValueDepth, which keeps that recursion off the end of the stack.
size_t nesting_depth(const Value& value);
inline constexpr size_t kMaxValueDepth = 256;

// Python's iter(x) materialized: list/tuple items, dict keys, string code points; Undefined
// iterates as empty. Fails for numbers, None and callables ("'int' object is not iterable"),
// and when the WorkMeter is spent (a string costs 16 bytes a character: one value each).
StatusOr<std::vector<Value>> iterate(const Value& value);

// JSON -> Value: objects become dicts in the JSON's key order (keep the order by passing
// ordered_json: json.dumps of tools then matches Python), integers that fit int64 become int,
// other numbers float.
Value value_from_json(const nlohmann::ordered_json& json);
Value value_from_json(const nlohmann::json& json);

}  // namespace pagoda::chat
