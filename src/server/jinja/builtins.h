// jinja2's built-in filters, tests, globals and the Python methods templates call on strings,
// lists and dicts, plus Python's operators: the library the evaluator (eval.h) dispatches to.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "server/jinja/parser.h"
#include "server/jinja/value.h"

namespace lragent::server::jinja {

class Interp;

// The arguments of a call, a filter or a test (after the value it applies to).
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Binds args to a signature as Python does: positional first, then by name; an error for too
// many, unknown or repeated arguments. Missing ones are nullopt.
Result<std::vector<std::optional<Value>>> bind_args(const CallArgs& args, const std::vector<const char*>& names,
                                                    const char* function);
using Bound = std::vector<std::optional<Value>>;

// What the filters share: a filter's error, an optional boolean argument, and "takes none".
inline Error filter_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, what}; }
inline bool flag(const std::optional<Value>& v, bool fallback) { return v ? v->truthy() : fallback; }
inline Status no_args(const CallArgs& a, const char* name) {
  auto b = bind_args(a, {}, name);
  if (!b.ok()) return b.error();
  return Status::Ok();
}

// Parse-time checks: jinja2 fails to compile a template naming an unknown filter or test.
bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);

Result<Value> apply_filter(Interp& in, const std::string& name, const Value& v, const CallArgs& args);
using FilterFn = Result<Value> (*)(Interp&, const Value&, const CallArgs&);
// The number, conversion and JSON filters (filters_num.cpp), for the table of filters.cpp.
const std::vector<std::pair<std::string_view, FilterFn>>& number_filters();
// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (item lookup first); with a
// fallback, every step that comes out undefined continues from the fallback instead.
Result<Value> attribute_path(Interp& in, const Value& item, const Value& attribute, const Value* fallback = nullptr);
Result<bool> apply_test(Interp& in, const std::string& name, const Value& v, const CallArgs& args);

// Methods: whether `obj` (a str, list, tuple or dict) has the method Python gives it, and whether
// the immutable sandbox forbids it (list.append, dict.update, ...).
enum class MethodKind { kNone, kSafe, kUnsafe };
MethodKind method_kind(const Value& obj, const std::string& name);
Result<Value> call_method(Interp& in, const Value& obj, const std::string& name, const CallArgs& args);

// Globals: range, namespace, dict, joiner, raise_exception, strftime_now (and cycler, lipsum,
// defined but not implemented).
const std::vector<const char*>& global_names();
Result<Value> call_global(Interp& in, const std::string& name, const CallArgs& args);

// Operators with Python's semantics (ints are 64-bit: overflow is an error).
Result<Value> binary_op(Interp& in, BinOp op, const Value& a, const Value& b);
Result<bool> compare_op(CmpOp op, const Value& a, const Value& b);
Result<Value> negate(const Value& v, bool minus);
// Python's a[start:stop:step] of a list, tuple or str (unset bounds: nullopt).
Result<Value> slice_value(Interp& in, const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
                          std::optional<int64_t> step);
// Python's `str % args` and str.format(*args, **kwargs); output past max_bytes is an error.
Result<std::string> percent_format(const std::string& fmt, const Value& args, size_t max_bytes);
Result<std::string> str_format(const std::string& fmt, const CallArgs& args, size_t max_bytes);

// Python's iter(v) materialised: a list's items, a dict's keys, a str's characters, nothing for
// undefined; an error for what Python cannot iterate.
Result<std::vector<Value>> iterate(const Value& v);
// len(v); an error where Python has none.
Result<int64_t> length_of(const Value& v);
// `needle in haystack`.
Result<bool> contains(const Value& haystack, const Value& needle);

}  // namespace lragent::server::jinja
