// The values a Jinja template computes with, with Python's semantics as jinja2 has them: str() and
// repr() text, truthiness, ==, ordering, and json.dumps. Lists, tuples, dicts and strings are
// immutable and shared (copying a Value is cheap); a namespace is the one mutable kind.
//
// Containers record how deeply they nest and whether they hold a namespace or loop object (the
// only things that can be mutated after they are built): the evaluator refuses values nested too
// deeply (every walk over a value recurses), and refuses to store a value holding a namespace or
// loop into a namespace attribute: values then only ever point at older ones, so no value can
// come to hold itself (a cycle would leak and make repr() endless), and depth stays bounded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server::jinja {

class Value;
class DictData;

// Values nest at most this deep (lists, dicts, tuples, namespaces); deeper is an error.
constexpr int kMaxValueDepth = 256;

// The heap part of a value. Subclasses defined by the evaluator (loops, callables) print
// themselves through repr().
struct Object {
  virtual ~Object() = default;
  virtual std::string repr() const { return "<object>"; }
  virtual bool holds_ref() const { return false; }  // see Value::holds_ref
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
    kTuple,
    kDict,
    kNamespace,
    kLoop,
    kCallable,
    kIterator,  // what jinja2's map, select, items, ... give: a generator (no len, always true)
  };

  Value() = default;  // undefined, with no hint
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value dict(DictData d);
  // A Python iterator over `items`, of the type Python names `type_name` ("generator", ...).
  // Unlike Python's it can be iterated more than once.
  static Value iterator(std::vector<Value> items, std::string type_name);
  // A generator whose body fails: jinja2's select, map, ... run only when iterated, so an error
  // in them surfaces there, or never.
  static Value failed_iterator(Error error);
  static Value object(Kind kind, std::shared_ptr<Object> obj);  // a loop or callable
  static Value new_namespace(DictData attrs);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // int, float or bool (a Python bool is a number).
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // int or bool
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& str() const;           // a string's text, or an undefined's hint
  const std::vector<Value>& items() const;  // list, tuple or iterator
  const Error* iterator_error() const;      // a failed iterator's error, else null
  const DictData& dict_data() const;        // dict, or a namespace's attributes
  DictData& namespace_attrs() const;        // a namespace's attributes (mutable)
  template <typename T>
  T* object_as() const {
    return static_cast<T*>(obj_.get());
  }

  bool truthy() const;
  int depth() const;              // 0 for scalars; 1 + the deepest element for containers
  bool holds_ref() const;         // a namespace or loop object, or a container holding one
  std::string type_name() const;  // Python's type name: 'str', 'int', 'list', 'NoneType', ...

 private:
  Kind kind_ = Kind::kUndefined;
  union {
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<Object> obj_;
};

// An insertion-ordered dict with Python's key semantics (1 == 1.0 == True are one key; lists and
// dicts cannot be keys).
class DictData {
 public:
  // nullptr: absent, or the key is unhashable.
  const Value* find(const Value& key) const;
  // false: the key is unhashable (a list, dict or namespace).
  bool set(const Value& key, Value value);
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;  // hash_key(key) -> position in entries_
};

// Python's hash identity of a key; nullopt: unhashable.
std::optional<std::string> hash_key(const Value& v);

// str(v) and repr(v) as Python prints them (an undefined prints as nothing, repr "Undefined").
std::string to_str(const Value& v);
std::string repr(const Value& v);
// Appends str(v) (or repr(v)); false, with `out` cut short, once `out` would pass max_bytes (a
// list can hold the same long string a million times).
bool append_str(std::string& out, const Value& v, size_t max_bytes);
bool append_repr(std::string& out, const Value& v, size_t max_bytes);
// Python's ==.
bool equals(const Value& a, const Value& b);
// Python's ordering: -1, 0, 1, or 2 when a NaN leaves two numbers unordered (every comparison
// false); an error for values Python cannot order ('<' between str and int).
Result<int> compare(const Value& a, const Value& b);

// transformers' tojson filter: json.dumps(v, ensure_ascii=False, indent, separators, sort_keys).
struct JsonOptions {
  std::optional<std::string> indent;                              // nullopt: one line
  std::optional<std::pair<std::string, std::string>> separators;  // item, key; nullopt: Python's default
  bool sort_keys = false;
  bool ensure_ascii = false;                   // non-ASCII as \uXXXX escapes
  size_t max_bytes = static_cast<size_t>(-1);  // longer output is an error
};
Result<std::string> dump_json(const Value& v, const JsonOptions& options);

// JSON to values: objects keep their key order; an error past kMaxValueDepth or for integers past
// int64 (Python's are unbounded).
Result<Value> from_json(const nlohmann::ordered_json& j);
// Values to JSON: tuples become arrays, and anything JSON has no form for is an error.
Result<nlohmann::ordered_json> to_json(const Value& v);

}  // namespace lragent::server::jinja
