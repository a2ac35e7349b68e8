// Values of the Jinja interpreter (core/chat): Python's data model as chat templates see it.
//
// A Value is one of: Undefined (Jinja's default Undefined, carrying the hint its errors name), None, bool, int
// (64-bit; Python's unbounded ints beyond that are refused), float, str (valid UTF-8; `markup` marks a |safe
// result, whose `+` escapes the other operand as markupsafe does), a list-like sequence (list, tuple or a dict view),
// dict (insertion-ordered, as Python's), a namespace() object (mutable, shared by reference), a callable (macro,
// builtin function, bound method) and the for-loop's `loop` object. Lists, dicts and strings are immutable and shared:
// copying a Value is cheap. The helpers below implement Python's truthiness, ==, ordering, str(), repr(), len() and
// iteration with Python's results and Python's TypeError cases (returned as errors, never thrown).
// Values are not thread-safe to share between renders that mutate namespaces; each render builds its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/base/expected.h"

namespace kestrel::chat::jinja {

class Value;
class Callable;
struct Namespace;
struct LoopState;

// The Python type behind a sequence Value: list, tuple, a dict's keys()/values()/items() view, or the generator that
// jinja2's select / reject / map / items filters return (iterable, but no len(), always true, not printable).
enum class SeqKind : uint8_t { kList, kTuple, kDictKeys, kDictValues, kDictItems, kGenerator };

struct List {
  std::vector<Value> items;
  SeqKind kind = SeqKind::kList;
};

struct Dict {
  std::vector<std::pair<Value, Value>> entries;  // insertion order
  const Value* find(const Value& key) const;     // Python key equality
  const Value* find(std::string_view key) const;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable,
    kLoop
  };

  Value();  // Undefined without a hint
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s, bool markup = false);
  static Value list(std::vector<Value> items, SeqKind kind = SeqKind::kList);
  static Value dict(Dict d);
  static Value name_space(std::shared_ptr<Namespace> ns);
  static Value callable(std::shared_ptr<const Callable> fn);
  static Value loop(std::shared_ptr<const LoopState> loop);

  Kind kind() const { return kind_; }
  // How deeply lists and dicts nest inside this value (0 for anything else); saturates at 65535.
  uint16_t depth() const { return depth_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }  // bool or int
  double as_float() const;                                                     // any number
  const std::string& str() const { return *s_; }
  bool markup() const { return markup_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Namespace& name_space() const { return *ns_; }
  const Callable& callable() const { return *fn_; }
  const LoopState& loop() const { return *loop_; }
  // "'x' is undefined", "'dict object' has no attribute 'y'" (empty for a bare Undefined).
  std::string_view undefined_hint() const { return s_ ? std::string_view(*s_) : std::string_view(); }

 private:
  Kind kind_ = Kind::kUndefined;
  uint16_t depth_ = 0;
  bool b_ = false;
  bool markup_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;  // str text; Undefined hint
  std::shared_ptr<const List> list_;
  std::shared_ptr<const Dict> dict_;
  std::shared_ptr<Namespace> ns_;
  std::shared_ptr<const Callable> fn_;
  std::shared_ptr<const LoopState> loop_;
};

// A namespace() object: attributes set with {% set ns.attr = ... %}.
struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value v);
};

// The state behind `loop` in one iteration of a for-loop.
struct LoopState {
  std::shared_ptr<const std::vector<Value>> items;  // the (filtered) sequence being iterated
  size_t index0 = 0;
  int64_t depth0 = 0;
};

class Evaluator;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Anything a template can call: macros, builtins (range, namespace, raise_exception, ...), bound methods.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual std::string repr() const = 0;  // what str() of it would show; also names it in errors
  virtual Expected<Value> call(Evaluator& ev, CallArgs args) const = 0;
};

// Containers nested deeper than this (a template growing a namespace attribute [[[...]]] in a loop) are refused:
// their recursive repr, comparison and destruction would exhaust the stack. Python stops near 1000 frames.
inline constexpr int kMaxNesting = 256;
// No string built by a filter or method (replace, indent, tojson, repr) is longer than this.
inline constexpr size_t kMaxStringBytes = size_t{256} << 20;
// No list built by an operation (repetition, concatenation, iteration of a string) holds more items than this.
inline constexpr size_t kMaxListItems = size_t{1} << 20;

// Errors as Jinja would raise them; the evaluator adds the template line.
Error type_error(std::string message);      // TypeError, ValueError, ... from Python operations
Error undefined_error(const Value& undef);  // UndefinedError: the hint of `undef`
Error unsupported(std::string message);     // a Python behaviour this interpreter does not implement

// Python's type name: "NoneType", "bool", "int", "float", "str", "list", "tuple", "dict", "dict_keys", ...
std::string type_name(const Value& v);

bool truthy(const Value& v);
bool py_equal(const Value& a, const Value& b);
enum class Order : uint8_t { kLt, kLe, kGt, kGe };
// a < b (etc.) for numbers, strings and sequences of them; TypeError otherwise, UndefinedError for Undefined.
Expected<bool> py_order(const Value& a, const Value& b, Order op);

// str(v) as Jinja prints it: Undefined -> "", None -> "None", True -> "True", floats as repr, containers as repr.
// kResourceExhausted past 256 MiB or for a namespace that contains itself (Python would print "{...}").
Expected<std::string> py_str(const Value& v);
Expected<std::string> py_repr(const Value& v);
// len(v): code points of a str, items of a container, 0 for Undefined.
Expected<int64_t> py_len(const Value& v);
// iter(v) materialised: list/tuple items, dict keys, str code points, nothing for Undefined.
Expected<std::vector<Value>> py_iterate(const Value& v);
// `needle in haystack`.
Expected<bool> py_contains(const Value& haystack, const Value& needle);

}  // namespace kestrel::chat::jinja
