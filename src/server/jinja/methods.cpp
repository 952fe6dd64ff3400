// jinja2's tests (tests.py), its globals as transformers sets them up, and the Python methods of
// str, list, tuple and dict that templates call, with the immutable sandbox's refusals.
#include <algorithm>
#include <unordered_map>

#include "server/jinja/builtins.h"
#include "server/jinja/eval.h"
#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

namespace {

using Bound = std::vector<std::optional<Value>>;

Error type_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, "TypeError: " + what}; }
Error value_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, "ValueError: " + what}; }

// ---- tests --------------------------------------------------------------------------------

using TestFn = Result<bool> (*)(Interp&, const Value&, const Bound&);

struct TestDef {
  TestFn fn;
  std::vector<const char*> params;
};

template <Value::Kind K>
Result<bool> is_kind(Interp&, const Value& v, const Bound&) {
  return v.kind() == K;
}

Result<bool> t_defined(Interp&, const Value& v, const Bound&) { return !v.is_undefined(); }
Result<bool> t_false(Interp&, const Value& v, const Bound&) { return v.kind() == Value::Kind::kBool && !v.as_bool(); }
Result<bool> t_true(Interp&, const Value& v, const Bound&) { return v.kind() == Value::Kind::kBool && v.as_bool(); }
Result<bool> t_number(Interp&, const Value& v, const Bound&) { return v.is_number(); }
Result<bool> t_escaped(Interp&, const Value&, const Bound&) { return false; }

Result<bool> t_iterable(Interp&, const Value& v, const Bound&) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() || v.kind() == Value::Kind::kLoop ||
         v.kind() == Value::Kind::kIterator;
}

Result<bool> t_sequence(Interp&, const Value& v, const Bound&) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
}

Result<bool> t_callable(Interp&, const Value& v, const Bound&) {
  // jinja2's Undefined and LoopContext define __call__.
  return v.kind() == Value::Kind::kCallable || v.kind() == Value::Kind::kLoop || v.is_undefined();
}

Result<bool> t_sameas(Interp&, const Value& v, const Bound& b) {
  const Value& o = *b[0];
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kUndefined: return true;
    case Value::Kind::kBool: return v.as_bool() == o.as_bool();
    case Value::Kind::kInt:
      return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;  // CPython's small ints
    case Value::Kind::kFloat: return false;
    case Value::Kind::kString: return &v.str() == &o.str();
    default: return v.object_as<Object>() == o.object_as<Object>();
  }
}

Result<bool> modulo_is(Interp& in, const Value& v, const Value& by, int64_t want) {
  LRA_ASSIGN_OR_RETURN(Value m, binary_op(in, BinOp::kMod, v, by));
  return equals(m, Value::integer(want));
}

Result<bool> t_odd(Interp& in, const Value& v, const Bound&) { return modulo_is(in, v, Value::integer(2), 1); }
Result<bool> t_even(Interp& in, const Value& v, const Bound&) { return modulo_is(in, v, Value::integer(2), 0); }
Result<bool> t_divisibleby(Interp& in, const Value& v, const Bound& b) { return modulo_is(in, v, *b[0], 0); }

Result<bool> t_lower(Interp& in, const Value& v, const Bound&) {
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  return py::is_lower(s);
}

Result<bool> t_upper(Interp& in, const Value& v, const Bound&) {
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  return py::is_upper(s);
}

Result<bool> t_in(Interp&, const Value& v, const Bound& b) { return contains(*b[0], v); }
Result<bool> t_filter(Interp&, const Value& v, const Bound&) { return v.is_string() && is_filter_name(v.str()); }
Result<bool> t_test(Interp&, const Value& v, const Bound&) { return v.is_string() && is_test_name(v.str()); }

template <CmpOp Op>
Result<bool> t_compare(Interp&, const Value& v, const Bound& b) {
  return compare_op(Op, v, *b[0]);
}

const std::unordered_map<std::string_view, TestDef>& tests() {
  static const std::vector<const char*> none, other = {"other"}, num = {"num"}, seq = {"seq"};
  static const std::unordered_map<std::string_view, TestDef> table = {
      {"defined", {t_defined, none}},
      {"undefined", {is_kind<Value::Kind::kUndefined>, none}},
      {"none", {is_kind<Value::Kind::kNone>, none}},
      {"boolean", {is_kind<Value::Kind::kBool>, none}},
      {"false", {t_false, none}},
      {"true", {t_true, none}},
      {"integer", {is_kind<Value::Kind::kInt>, none}},
      {"float", {is_kind<Value::Kind::kFloat>, none}},
      {"number", {t_number, none}},
      {"string", {is_kind<Value::Kind::kString>, none}},
      {"mapping", {is_kind<Value::Kind::kDict>, none}},
      {"iterable", {t_iterable, none}},
      {"sequence", {t_sequence, none}},
      {"callable", {t_callable, none}},
      {"sameas", {t_sameas, other}},
      {"escaped", {t_escaped, none}},
      {"odd", {t_odd, none}},
      {"even", {t_even, none}},
      {"divisibleby", {t_divisibleby, num}},
      {"lower", {t_lower, none}},
      {"upper", {t_upper, none}},
      {"in", {t_in, seq}},
      {"filter", {t_filter, none}},
      {"test", {t_test, none}},
      {"eq", {t_compare<CmpOp::kEq>, other}},
      {"equalto", {t_compare<CmpOp::kEq>, other}},
      {"==", {t_compare<CmpOp::kEq>, other}},
      {"ne", {t_compare<CmpOp::kNe>, other}},
      {"!=", {t_compare<CmpOp::kNe>, other}},
      {"lt", {t_compare<CmpOp::kLt>, other}},
      {"lessthan", {t_compare<CmpOp::kLt>, other}},
      {"<", {t_compare<CmpOp::kLt>, other}},
      {"le", {t_compare<CmpOp::kLe>, other}},
      {"<=", {t_compare<CmpOp::kLe>, other}},
      {"gt", {t_compare<CmpOp::kGt>, other}},
      {"greaterthan", {t_compare<CmpOp::kGt>, other}},
      {">", {t_compare<CmpOp::kGt>, other}},
      {"ge", {t_compare<CmpOp::kGe>, other}},
      {">=", {t_compare<CmpOp::kGe>, other}},
  };
  return table;
}

// ---- str methods --------------------------------------------------------------------------

// Python's handling of optional start/end arguments of find, count, startswith, ...: slice
// indices clamped to the string.
void clamp_range(const Bound& b, size_t first, size_t n, size_t* start, size_t* end) {
  auto idx = [&](const std::optional<Value>& v, size_t fallback) -> size_t {
    if (!v || !v->is_integral()) return fallback;
    int64_t i = v->as_int();
    if (i < 0) i = std::max<int64_t>(i + static_cast<int64_t>(n), 0);
    return std::min(static_cast<size_t>(i), n);
  };
  *start = idx(b[first], 0);
  *end = idx(b[first + 1], n);
}

Result<Value> split(const std::u32string& s, const std::optional<Value>& sep_v, const std::optional<Value>& max_v,
                    bool right) {
  int64_t maxsplit = max_v && max_v->is_integral() ? max_v->as_int() : -1;
  if (max_v && !max_v->is_integral()) return type_error("maxsplit must be an integer");
  std::vector<std::u32string> parts;
  if (!sep_v || sep_v->is_none()) {
    // Runs of whitespace separate; none at either end.
    std::u32string u = s;
    if (right) std::reverse(u.begin(), u.end());
    size_t i = 0;
    while (true) {
      while (i < u.size() && py::is_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(u.substr(i));  // the rest as it is, trailing whitespace included
        break;
      }
      size_t j = i;
      while (j < u.size() && !py::is_space(u[j])) ++j;
      parts.push_back(u.substr(i, j - i));
      i = j;
    }
    if (right) {
      for (auto& p : parts) std::reverse(p.begin(), p.end());
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    if (!sep_v->is_string()) return type_error(fmt::format("must be str or None, not {}", sep_v->type_name()));
    const std::u32string sep = py::decode(sep_v->str());
    if (sep.empty()) return value_error("empty separator");
    if (!right) {
      size_t start = 0;
      while (true) {
        const size_t p =
            maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit ? std::u32string::npos : s.find(sep, start);
        if (p == std::u32string::npos) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, p - start));
        start = p + sep.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        const size_t p = maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit
                             ? std::u32string::npos
                             : (end < sep.size() ? std::u32string::npos : s.rfind(sep, end - sep.size()));
        if (p == std::u32string::npos) {
          parts.push_back(s.substr(0, end));
          break;
        }
        parts.push_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  for (const auto& p : parts) out.push_back(Value::string(py::encode(p)));
  return Value::list(std::move(out));
}

Result<Value> replace(Interp& in, const std::u32string& s, const std::u32string& old, const std::u32string& repl,
                      int64_t count) {
  std::u32string out;
  size_t n = 0;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    const size_t limit = count < 0 ? s.size() + 1 : static_cast<size_t>(count);
    LRA_RETURN_IF_ERROR(in.check_bytes((std::min(limit, s.size() + 1)) * repl.size() + s.size()));
    for (size_t i = 0; i <= s.size(); ++i) {
      if (n < limit) {
        out += repl;
        ++n;
      }
      if (i < s.size()) out.push_back(s[i]);
    }
  } else {
    size_t start = 0;
    while (true) {
      const size_t p = (count >= 0 && static_cast<int64_t>(n) >= count) ? std::u32string::npos : s.find(old, start);
      if (p == std::u32string::npos) break;
      out.append(s, start, p - start);
      out += repl;
      LRA_RETURN_IF_ERROR(in.check_bytes(out.size()));
      start = p + old.size();
      ++n;
    }
    out.append(s, start, std::u32string::npos);
  }
  return Value::string(py::encode(out));
}

Result<Value> pad(Interp& in, const std::u32string& s, const Bound& b, char how) {
  if (!b[0] || !b[0]->is_integral()) return type_error("width must be an integer");
  char32_t fill = ' ';
  if (b[1]) {
    const std::u32string f = b[1]->is_string() ? py::decode(b[1]->str()) : std::u32string();
    if (f.size() != 1) return type_error("The fill character must be exactly one character long");
    fill = f[0];
  }
  const int64_t width = b[0]->as_int(), len = static_cast<int64_t>(s.size());
  if (width <= len) return Value::string(py::encode(s));
  LRA_RETURN_IF_ERROR(in.check_bytes(static_cast<size_t>(width) * 4));
  const int64_t marg = width - len;
  int64_t left = how == '<' ? 0 : how == '>' ? marg : marg / 2 + (marg & width & 1);
  if (how == 'z') {  // zfill: zeros after a sign
    std::u32string out = s;
    const size_t at = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
    out.insert(at, static_cast<size_t>(marg), U'0');
    return Value::string(py::encode(out));
  }
  return Value::string(py::encode(std::u32string(static_cast<size_t>(left), fill) + s +
                                  std::u32string(static_cast<size_t>(marg - left), fill)));
}

Result<Value> str_method(Interp& in, const std::string& self, const std::string& name, const CallArgs& a) {
  auto bind = [&](std::vector<const char*> names) { return bind_args(a, names, name.c_str()); };
  auto str_arg = [&](const std::optional<Value>& v) -> Result<std::u32string> {
    if (!v || !v->is_string()) return type_error(fmt::format("{}() argument must be str", name));
    return py::decode(v->str());
  };
  const std::u32string s = py::decode(self);
  if (name == "format") {
    LRA_ASSIGN_OR_RETURN(std::string r, str_format(self, a, in.options().max_output_bytes));
    return Value::string(std::move(r));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "casefold") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({}));
    return Value::string(name == "upper"        ? py::upper(self)
                         : name == "title"      ? py::title(self)
                         : name == "capitalize" ? py::capitalize(self)
                                                : py::lower(self));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"chars"}));
    std::optional<std::string> chars;
    if (b[0] && !b[0]->is_none()) {
      if (!b[0]->is_string()) return type_error(fmt::format("{} arg must be None or str", name));
      chars = b[0]->str();
    }
    return Value::string(py::strip(self, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"sep", "maxsplit"}));
    return split(s, b[0], b[1], name == "rsplit");
  }
  if (name == "splitlines") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"keepends"}));
    std::vector<Value> out;
    size_t start = 0;
    auto brk = [](char32_t c) {
      return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
             c == 0x2029;
    };
    for (size_t i = 0; i < s.size(); ++i) {
      if (!brk(s[i])) continue;
      size_t e = i;
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      out.push_back(Value::string(py::encode(s.substr(start, (b[0] && b[0]->truthy() ? i + 1 : e) - start))));
      start = i + 1;
    }
    if (start < s.size()) out.push_back(Value::string(py::encode(s.substr(start))));
    return Value::list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"prefix", "start", "end"}));
    size_t start, end;
    clamp_range(b, 1, s.size(), &start, &end);
    std::vector<Value> options;
    if (b[0] && b[0]->kind() == Value::Kind::kTuple)
      options = b[0]->items();
    else if (b[0])
      options = {*b[0]};
    for (const Value& o : options) {
      if (!o.is_string()) return type_error(fmt::format("{} first arg must be str or a tuple of str", name));
      const std::u32string p = py::decode(o.str());
      if (start > end || end - start < p.size()) continue;
      if (name == "startswith" ? s.compare(start, p.size(), p) == 0 : s.compare(end - p.size(), p.size(), p) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"sub", "start", "end"}));
    LRA_ASSIGN_OR_RETURN(std::u32string sub, str_arg(b[0]));
    size_t start, end;
    clamp_range(b, 1, s.size(), &start, &end);
    const std::u32string hay = start <= end ? s.substr(start, end - start) : std::u32string();
    if (name == "count") {
      if (start > end) return Value::integer(0);
      if (sub.empty()) return Value::integer(static_cast<int64_t>(hay.size() + 1));
      int64_t c = 0;
      for (size_t p = hay.find(sub); p != std::u32string::npos; p = hay.find(sub, p + sub.size())) ++c;
      return Value::integer(c);
    }
    const bool from_right = name[0] == 'r';
    const size_t p = start > end ? std::u32string::npos : from_right ? hay.rfind(sub) : hay.find(sub);
    if (p == std::u32string::npos) {
      if (name == "index" || name == "rindex") return value_error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(p + start));
  }
  if (name == "replace") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"old", "new", "count"}));
    LRA_ASSIGN_OR_RETURN(std::u32string old_s, str_arg(b[0]));
    LRA_ASSIGN_OR_RETURN(std::u32string new_s, str_arg(b[1]));
    if (b[2] && !b[2]->is_integral()) return type_error("replace() count must be an integer");
    return replace(in, s, old_s, new_s, b[2] ? b[2]->as_int() : -1);
  }
  if (name == "join") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"iterable"}));
    if (!b[0]) return type_error("join() takes exactly one argument");
    LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(*b[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        return type_error(fmt::format("sequence item {}: expected str instance, {} found", i, items[i].type_name()));
      if (i) out += self;
      out += items[i].str();
      LRA_RETURN_IF_ERROR(in.check_bytes(out.size()));
    }
    return Value::string(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    LRA_ASSIGN_OR_RETURN(Bound b, name == "zfill" ? bind({"width"}) : bind({"width", "fillchar"}));
    if (name == "zfill") b.resize(2);
    return pad(in, s, b, name == "center" ? '^' : name == "ljust" ? '<' : name == "rjust" ? '>' : 'z');
  }
  if (name == "partition" || name == "rpartition") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"sep"}));
    LRA_ASSIGN_OR_RETURN(std::u32string sep, str_arg(b[0]));
    if (sep.empty()) return value_error("empty separator");
    const size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::u32string::npos) {
      const Value whole = Value::string(self), empty = Value::string("");
      return name == "partition" ? Value::tuple({whole, empty, empty}) : Value::tuple({empty, empty, whole});
    }
    return Value::tuple({Value::string(py::encode(s.substr(0, p))), Value::string(py::encode(sep)),
                         Value::string(py::encode(s.substr(p + sep.size())))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind({"affix"}));
    LRA_ASSIGN_OR_RETURN(std::u32string x, str_arg(b[0]));
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::string(py::encode(s.substr(x.size())));
    if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value::string(py::encode(s.substr(0, s.size() - x.size())));
    return Value::string(self);
  }
  // The is* predicates.
  LRA_ASSIGN_OR_RETURN(Bound b, bind({}));
  if (name == "islower") return Value::boolean(py::is_lower(self));
  if (name == "isupper") return Value::boolean(py::is_upper(self));
  bool (*pred)(char32_t) = name == "isalpha"   ? py::is_alpha
                           : name == "isdigit" ? py::is_digit
                           : name == "isspace" ? py::is_space
                                               : py::is_word;
  if (s.empty()) return Value::boolean(false);
  for (char32_t c : s)
    if (!pred(c) || (name == "isalnum" && c == '_')) return Value::boolean(false);
  return Value::boolean(true);
}

const char* const kStrMethods[] = {
    "capitalize", "casefold",     "center",       "count",      "endswith", "find",   "format", "index",      "isalnum",
    "isalpha",    "isdigit",      "islower",      "isspace",    "isupper",  "join",   "ljust",  "lower",      "lstrip",
    "partition",  "removeprefix", "removesuffix", "replace",    "rfind",    "rindex", "rjust",  "rpartition", "rsplit",
    "rstrip",     "split",        "splitlines",   "startswith", "strip",    "title",  "upper",  "zfill"};
const char* const kListSafe[] = {"count", "index", "copy"};
const char* const kListUnsafe[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
const char* const kDictSafe[] = {"copy", "get", "items", "keys", "values"};
const char* const kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
bool listed(const char* const (&names)[N], const std::string& name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

}  // namespace

Result<std::vector<std::optional<Value>>> bind_args(const CallArgs& args, const std::vector<const char*>& names,
                                                    const char* function) {
  if (args.pos.size() > names.size())
    return type_error(
        fmt::format("{}() takes at most {} argument(s) ({} given)", function, names.size(), args.pos.size()));
  std::vector<std::optional<Value>> out(names.size());
  for (size_t i = 0; i < args.pos.size(); ++i) out[i] = args.pos[i];
  for (const auto& kv : args.kw) {
    const std::string& key = kv.first;
    auto it = std::find_if(names.begin(), names.end(), [&](const char* n) { return key == n; });
    if (it == names.end())
      return type_error(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
    auto& slot = out[static_cast<size_t>(it - names.begin())];
    if (slot) return type_error(fmt::format("{}() got multiple values for argument '{}'", function, key));
    slot = kv.second;
  }
  return out;
}

bool is_test_name(std::string_view name) { return tests().count(name) != 0; }

Result<bool> apply_test(Interp& in, const std::string& name, const Value& v, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) return Error{ErrorCode::kInvalidArgument, fmt::format("No test named '{}'.", name)};
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(args, it->second.params, name.c_str()));
  for (const auto& slot : b)
    if (!slot) return type_error(fmt::format("test '{}' is missing an argument", name));
  return it->second.fn(in, v, b);
}

MethodKind method_kind(const Value& obj, const std::string& name) {
  if (obj.is_string()) return listed(kStrMethods, name) ? MethodKind::kSafe : MethodKind::kNone;
  if (obj.is_sequence()) {
    if (listed(kListSafe, name) && (name != "copy" || obj.kind() == Value::Kind::kList)) return MethodKind::kSafe;
    if (obj.kind() == Value::Kind::kList && listed(kListUnsafe, name)) return MethodKind::kUnsafe;
    return MethodKind::kNone;
  }
  if (obj.is_dict()) {
    if (listed(kDictSafe, name)) return MethodKind::kSafe;
    if (listed(kDictUnsafe, name)) return MethodKind::kUnsafe;
  }
  return MethodKind::kNone;
}

Result<Value> call_method(Interp& in, const Value& obj, const std::string& name, const CallArgs& args) {
  LRA_RETURN_IF_ERROR(in.charge(obj.is_string() ? obj.str().size() / 16 : obj.is_sequence() ? obj.items().size() : 1));
  if (obj.is_string()) return str_method(in, obj.str(), name, args);
  if (obj.is_sequence()) {
    if (name == "copy") return obj;
    LRA_ASSIGN_OR_RETURN(Bound b, bind_args(args, {"value", "start", "end"}, name.c_str()));
    if (!b[0]) return type_error(fmt::format("{}() takes at least 1 argument (0 given)", name));
    const auto& items = obj.items();
    if (name == "count") {
      return Value::integer(
          std::count_if(items.begin(), items.end(), [&](const Value& e) { return equals(e, *b[0]); }));
    }
    size_t start, end;
    clamp_range(b, 1, items.size(), &start, &end);
    for (size_t i = start; i < end; ++i)
      if (equals(items[i], *b[0])) return Value::integer(static_cast<int64_t>(i));
    return value_error(fmt::format("{}.index(x): x not in {}", obj.type_name(), obj.type_name()));
  }
  const DictData& d = obj.dict_data();
  if (name == "copy") return obj;
  if (name == "get") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind_args(args, {"key", "default"}, "get"));
    if (!b[0]) return type_error("get expected at least 1 argument, got 0");
    if (!hash_key(*b[0])) return type_error(fmt::format("unhashable type: '{}'", b[0]->type_name()));
    if (const Value* v = d.find(*b[0])) return *v;
    return b[1] ? *b[1] : Value::none();
  }
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(args, {}, name.c_str()));
  std::vector<Value> out;
  for (const auto& [k, v] : d.entries())
    out.push_back(name == "keys" ? k : name == "values" ? v : Value::tuple({k, v}));
  return Value::list(std::move(out));
}

const std::vector<const char*>& global_names() {
  static const std::vector<const char*> names = {"range",        "namespace", "dict",   "raise_exception",
                                                 "strftime_now", "joiner",    "cycler", "lipsum"};
  return names;
}

Result<Value> call_global(Interp& in, const std::string& name, const CallArgs& a) {
  if (name == "raise_exception") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"message"}, "raise_exception"));
    std::string message = b[0] ? to_str(*b[0]) : "";
    return Error{ErrorCode::kInvalidArgument, std::string(kRaisedPrefix) + message};
  }
  if (name == "strftime_now") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"format"}, "strftime_now"));
    if (!b[0] || !b[0]->is_string()) return type_error("strftime_now() argument must be str");
    const auto& f = in.options().strftime_now;
    return Value::string(f ? f(b[0]->str()) : strftime_local_now(b[0]->str()));
  }
  if (name == "joiner") {
    LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"sep"}, "joiner"));
    auto j = std::make_shared<Callable>();
    j->kind = Callable::Kind::kJoiner;
    j->name = b[0] ? to_str(*b[0]) : ", ";
    return Value::object(Value::Kind::kCallable, std::move(j));
  }
  if (name == "cycler" || name == "lipsum")  // defined, as in jinja2, but not implemented
    return Error{ErrorCode::kInvalidArgument, fmt::format("{}() is not supported", name)};
  if (name == "range") {
    if (!a.kw.empty()) return type_error("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3)
      return type_error(fmt::format("range expected 1 to 3 arguments, got {}", a.pos.size()));
    for (const Value& v : a.pos)
      if (!v.is_integral())
        return type_error(fmt::format("'{}' object cannot be interpreted as an integer", v.type_name()));
    const int64_t start = a.pos.size() == 1 ? 0 : a.pos[0].as_int();
    const int64_t stop = a.pos.size() == 1 ? a.pos[0].as_int() : a.pos[1].as_int();
    const int64_t step = a.pos.size() == 3 ? a.pos[2].as_int() : 1;
    if (step == 0) return value_error("range() arg 3 must not be zero");
    const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 mag = step > 0 ? static_cast<__int128>(step) : -static_cast<__int128>(step);
    const __int128 n = span <= 0 ? 0 : (span - 1) / mag + 1;
    // jinja2's sandbox refuses ranges past MAX_RANGE.
    if (n > 100000)
      return Error{ErrorCode::kInvalidArgument,
                   "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."};
    std::vector<Value> out;
    for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out.push_back(Value::integer(start + i * step));
    LRA_RETURN_IF_ERROR(in.charge(out.size()));
    return Value::list(std::move(out));
  }
  // namespace(...) and dict(...): Python's dict(mapping or pairs, **kwargs).
  if (a.pos.size() > 1) return type_error(fmt::format("{} expected at most 1 argument, got {}", name, a.pos.size()));
  DictData d;
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict_data().entries()) d.set(k, v);
    } else {
      LRA_ASSIGN_OR_RETURN(std::vector<Value> pairs, iterate(src));
      for (const Value& p : pairs) {
        LRA_ASSIGN_OR_RETURN(std::vector<Value> kv, iterate(p));
        if (kv.size() != 2)
          return value_error("dictionary update sequence element has the wrong length; 2 is required");
        if (!d.set(kv[0], kv[1])) return type_error(fmt::format("unhashable type: '{}'", kv[0].type_name()));
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value::string(k), v);
  if (name == "dict") {
    Value v = Value::dict(std::move(d));
    LRA_RETURN_IF_ERROR(in.check_value(v));
    return v;
  }
  // A new namespace may hold older namespaces (it cannot hold itself); `set ns.attr` is what
  // refuses them (Interp::assign).
  for (const auto& [k, v] : d.entries())
    if (!k.is_string()) return type_error("namespace attribute names must be strings");
  Value ns = Value::new_namespace(std::move(d));
  LRA_RETURN_IF_ERROR(in.check_value(ns));
  return ns;
}

}  // namespace lragent::server::jinja
