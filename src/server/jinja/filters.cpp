// jinja2's built-in filters (filters.py), with transformers' tojson, on Values. Each takes its
// arguments by jinja2's signature (positional or by name).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "server/jinja/builtins.h"
#include "server/jinja/eval.h"
#include "server/jinja/pystr.h"

namespace lragent::server::jinja {


Result<Value> attribute_path(Interp& in, const Value& item, const Value& attribute, const Value* fallback) {
  auto step = [&](const Value& from, const Value& key) -> Result<Value> {
    LRA_ASSIGN_OR_RETURN(Value v, in.getitem(from, key));
    if (fallback && v.is_undefined()) return *fallback;
    return v;
  };
  if (!attribute.is_string()) return step(item, attribute);
  Value v = item;
  const std::string& path = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.size() < 18 && part.find_first_not_of("0123456789") == std::string::npos;
    LRA_ASSIGN_OR_RETURN(v, step(v, digits ? Value::integer(std::stoll(part)) : Value::string(part)));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

namespace {

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py::lower(v.str())) : v; }

// A stable merge sort by Python's <; a comparison Python cannot make fails the sort (std::sort
// must not be handed an inconsistent order).
Status merge_sort(std::vector<size_t>& idx, const std::function<Result<bool>(size_t, size_t)>& less) {
  if (idx.size() < 2) return Status::Ok();
  std::vector<size_t> left(idx.begin(), idx.begin() + static_cast<long>(idx.size() / 2));
  std::vector<size_t> right(idx.begin() + static_cast<long>(idx.size() / 2), idx.end());
  LRA_RETURN_IF_ERROR(merge_sort(left, less));
  LRA_RETURN_IF_ERROR(merge_sort(right, less));
  size_t i = 0, j = 0, k = 0;
  while (i < left.size() && j < right.size()) {
    LRA_ASSIGN_OR_RETURN(bool take_right, less(right[j], left[i]));
    idx[k++] = take_right ? right[j++] : left[i++];
  }
  while (i < left.size()) idx[k++] = left[i++];
  while (j < right.size()) idx[k++] = right[j++];
  return Status::Ok();
}

// Python's sorted(items, key=keys[i], reverse): a stable order of the indexes.
Result<std::vector<size_t>> sorted_order(Interp& in, const std::vector<Value>& keys, bool reverse) {
  LRA_RETURN_IF_ERROR(in.charge(keys.size() * 8));
  std::vector<size_t> idx(keys.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  LRA_RETURN_IF_ERROR(merge_sort(idx, [&](size_t a, size_t b) -> Result<bool> {
    LRA_ASSIGN_OR_RETURN(bool lt, compare_op(CmpOp::kLt, reverse ? keys[b] : keys[a], reverse ? keys[a] : keys[b]));
    return lt;
  }));
  return idx;
}

Result<Value> f_attr(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"name"}, "attr"));
  if (!b[0]) return filter_error("attr() missing its name argument");
  const std::string name = to_str(*b[0]);
  // getattr only: a dict's keys are not attributes here (jinja2's do_attr has no item fallback).
  if (v.is_dict() && method_kind(v, name) == MethodKind::kNone)
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  return in.getattr(v, name);
}

Result<Value> f_batch_body(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"linecount", "fill_with"}, "batch"));
  if (!b[0] || !b[0]->is_integral()) return filter_error("batch() needs an integer linecount");
  const int64_t n = b[0]->as_int();
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  std::vector<Value> out, tmp;
  for (Value& item : items) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(std::move(item));
  }
  if (!tmp.empty()) {
    if (b[1] && !b[1]->is_none() && static_cast<int64_t>(tmp.size()) < n) {
      LRA_RETURN_IF_ERROR(in.check_items(static_cast<size_t>(n)));
      tmp.resize(static_cast<size_t>(n), *b[1]);
    }
    out.push_back(Value::list(std::move(tmp)));
  }
  Value r = Value::iterator(std::move(out), "generator");
  LRA_RETURN_IF_ERROR(in.check_value(r));
  return r;
}

// The filters that take a string and no arguments.
template <std::string (*F)(std::string_view)>
Result<Value> string_filter(Interp& in, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "filter"));
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  LRA_RETURN_IF_ERROR(in.charge(s.size() / 16));
  std::string r = F(s);
  LRA_RETURN_IF_ERROR(in.check_bytes(r.size()));
  return Value::string(std::move(r));
}

std::string identity(std::string_view s) { return std::string(s); }

std::string jinja_title(std::string_view s) {
  // jinja2 splits before runs of "-", whitespace, "(", "{", "[" and "<"; each piece's first
  // character is upper-cased and the rest lower-cased.
  const std::u32string u = py::decode(s);
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c); };
  std::string out;
  bool start = true;
  for (char32_t c : u) {
    if (is_sep(c)) {
      py::append_utf8(out, c);
      start = true;
    } else if (start) {
      out += py::upper(py::encode(std::u32string(1, c)));
      start = false;
    } else {
      out += py::lower(py::encode(std::u32string(1, c)));
    }
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Result<Value> f_default(Interp&, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"default_value", "boolean"}, "default"));
  if (v.is_undefined() || (flag(b[1], false) && !v.truthy())) return b[0] ? *b[0] : Value::string("");
  return v;
}

Result<Value> f_dictsort(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"case_sensitive", "by", "reverse"}, "dictsort"));
  if (!v.is_dict())
    return filter_error(fmt::format("AttributeError: '{}' object has no attribute 'items'", v.type_name()));
  const std::string by = b[1] ? to_str(*b[1]) : "key";
  if (by != "key" && by != "value") return filter_error("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> keys, pairs;
  for (const auto& [k, e] : v.dict_data().entries()) {
    const Value& key = by == "key" ? k : e;
    keys.push_back(flag(b[0], false) ? key : ignore_case(key));
    pairs.push_back(Value::tuple({k, e}));
  }
  LRA_ASSIGN_OR_RETURN(std::vector<size_t> order, sorted_order(in, keys, flag(b[2], false)));
  std::vector<Value> out;
  for (size_t i : order) out.push_back(pairs[i]);
  return Value::list(std::move(out));
}

Result<Value> first_or_last(const Value& v, bool last) {
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  if (items.empty())
    return Value::undefined(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
  return last ? items.back() : items.front();
}

Result<Value> f_first(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "first"));
  return first_or_last(v, false);
}

Result<Value> f_last(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "last"));
  if (!v.is_undefined() && !v.is_sequence() && !v.is_string() && !v.is_dict())
    return filter_error(fmt::format("TypeError: '{}' object is not reversible", v.type_name()));
  return first_or_last(v, true);
}

Result<Value> f_format(Interp& in, const Value& v, const CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty())
    return filter_error("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    DictData d;
    for (const auto& [k, x] : a.kw) d.set(Value::string(k), x);
    args = Value::dict(std::move(d));
  } else {
    args = Value::tuple(a.pos);
  }
  LRA_ASSIGN_OR_RETURN(std::string fmt, in.str(v));
  LRA_ASSIGN_OR_RETURN(std::string s, percent_format(fmt, args, in.options().max_output_bytes));
  return Value::string(std::move(s));
}

// Python's str.splitlines() line breaks.
bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::vector<std::u32string> split_lines(const std::u32string& u) {
  std::vector<std::u32string> lines;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!is_line_break(u[i])) continue;
    lines.push_back(u.substr(start, i - start));
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < u.size()) lines.push_back(u.substr(start));
  return lines;
}

Result<Value> f_indent(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"width", "first", "blank"}, "indent"));
  std::string indention;
  if (b[0] && b[0]->is_string()) {
    indention = b[0]->str();
  } else if (b[0]) {
    if (!b[0]->is_integral()) return filter_error("TypeError: indent width must be an integer or a string");
    LRA_RETURN_IF_ERROR(in.check_bytes(static_cast<size_t>(std::max<int64_t>(b[0]->as_int(), 0))));
    indention.assign(static_cast<size_t>(std::max<int64_t>(b[0]->as_int(), 0)), ' ');
  } else {
    indention = "    ";
  }
  // jinja2 appends "\n" to the value as it is: anything but a string fails there.
  if (!v.is_string())
    return filter_error(fmt::format("TypeError: unsupported operand type(s) for +=: '{}' and 'str'", v.type_name()));
  const std::string& s = v.str();
  const std::vector<std::u32string> lines = split_lines(py::decode(s + "\n"));
  LRA_RETURN_IF_ERROR(in.check_bytes(s.size() + (lines.size() + 1) * indention.size()));
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) rv += "\n";
    if (i && (flag(b[2], false) || !lines[i].empty())) rv += indention;
    rv += py::encode(lines[i]);
  }
  if (flag(b[1], false)) rv = indention + rv;
  return Value::string(std::move(rv));
}

Result<Value> f_items_body(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "items"));
  if (v.is_undefined()) return Value::iterator({}, "generator");
  if (!v.is_dict()) return filter_error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, e] : v.dict_data().entries()) out.push_back(Value::tuple({k, e}));
  return Value::iterator(std::move(out), "generator");
}

Result<Value> f_join(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"d", "attribute"}, "join"));
  const std::string sep = b[0] ? to_str(*b[0]) : "";
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  LRA_RETURN_IF_ERROR(in.charge(items.size()));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    Value item = items[i];
    if (b[1] && !b[1]->is_none()) {
      LRA_ASSIGN_OR_RETURN(item, attribute_path(in, item, *b[1]));
    }
    if (!append_str(out, item, in.options().max_output_bytes))
      return in.check_bytes(in.options().max_output_bytes + 1).error();
    LRA_RETURN_IF_ERROR(in.check_bytes(out.size()));
  }
  return Value::string(std::move(out));
}

Result<Value> f_length(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "length"));
  LRA_ASSIGN_OR_RETURN(int64_t n, length_of(v));
  return Value::integer(n);
}

Result<Value> f_list(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "list"));
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  return Value::list(std::move(items));
}

Result<Value> f_map_body(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  LRA_RETURN_IF_ERROR(in.charge(items.size()));
  std::vector<Value> out;
  auto attr = std::find_if(a.kw.begin(), a.kw.end(), [](const auto& kv) { return kv.first == "attribute"; });
  if (a.pos.empty() && attr != a.kw.end()) {
    std::optional<Value> fallback;
    for (const auto& [k, x] : a.kw) {
      if (k == "default")
        fallback = x;
      else if (k != "attribute")
        return filter_error(fmt::format("Unexpected keyword argument '{}'", k));
    }
    for (const Value& item : items) {
      LRA_ASSIGN_OR_RETURN(Value r, attribute_path(in, item, attr->second, fallback ? &*fallback : nullptr));
      out.push_back(std::move(r));
    }
    return Value::iterator(std::move(out), "generator");
  }
  if (a.pos.empty()) return filter_error("map requires a filter argument");
  const std::string name = to_str(a.pos[0]);
  if (!is_filter_name(name)) return filter_error(fmt::format("No filter named '{}'.", name));
  CallArgs rest{std::vector<Value>(a.pos.begin() + 1, a.pos.end()), a.kw};
  for (const Value& item : items) {
    LRA_ASSIGN_OR_RETURN(Value r, apply_filter(in, name, item, rest));
    out.push_back(std::move(r));
  }
  return Value::iterator(std::move(out), "generator");
}

Result<Value> min_max(Interp& in, const Value& v, const CallArgs& a, bool max) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"case_sensitive", "attribute"}, max ? "max" : "min"));
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  LRA_RETURN_IF_ERROR(in.charge(items.size()));
  std::vector<Value> keys;
  for (const Value& item : items) {
    Value k = item;
    if (b[1] && !b[1]->is_none()) {
      LRA_ASSIGN_OR_RETURN(k, attribute_path(in, item, *b[1]));
    }
    keys.push_back(flag(b[0], false) ? k : ignore_case(k));
  }
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    LRA_ASSIGN_OR_RETURN(bool better, compare_op(max ? CmpOp::kGt : CmpOp::kLt, keys[i], keys[best]));
    if (better) best = i;
  }
  return items[best];
}

Result<Value> f_max(Interp& in, const Value& v, const CallArgs& a) { return min_max(in, v, a, true); }
Result<Value> f_min(Interp& in, const Value& v, const CallArgs& a) { return min_max(in, v, a, false); }

// select / reject / selectattr / rejectattr.
Result<Value> select_common(Interp& in, const Value& v, const CallArgs& a, bool keep_if, bool by_attr) {
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  LRA_RETURN_IF_ERROR(in.charge(items.size()));
  size_t off = 0;
  if (by_attr && a.pos.empty()) return filter_error("Missing parameter for attribute name");
  if (by_attr) off = 1;
  std::optional<std::string> test;
  if (a.pos.size() > off) {
    test = to_str(a.pos[off]);
    if (!is_test_name(*test)) return filter_error(fmt::format("No test named '{}'.", *test));
  }
  CallArgs rest{std::vector<Value>(a.pos.begin() + static_cast<long>(std::min(a.pos.size(), off + 1)), a.pos.end()),
                a.kw};
  std::vector<Value> out;
  for (const Value& item : items) {
    Value x = item;
    if (by_attr) {
      LRA_ASSIGN_OR_RETURN(x, attribute_path(in, item, a.pos[0]));
    }
    bool r = x.truthy();
    if (test) {
      LRA_ASSIGN_OR_RETURN(r, apply_test(in, *test, x, rest));
    }
    if (r == keep_if) out.push_back(item);
  }
  return Value::iterator(std::move(out), "generator");
}

Result<Value> f_replace(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"old", "new", "count"}, "replace"));
  if (!b[0] || !b[1]) return filter_error("replace() needs old and new");
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  LRA_ASSIGN_OR_RETURN(std::string old_s, in.str(*b[0]));
  LRA_ASSIGN_OR_RETURN(std::string new_s, in.str(*b[1]));
  Value count = b[2] && !b[2]->is_none() ? *b[2] : Value::integer(-1);
  CallArgs margs{{Value::string(old_s), Value::string(new_s), count}, {}};
  return call_method(in, Value::string(std::move(s)), "replace", margs);
}

Result<Value> f_reverse(Interp&, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "reverse"));
  if (v.is_string()) {
    std::u32string u = py::decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(py::encode(u));
  }
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  std::reverse(items.begin(), items.end());
  // Python's reversed() where it works (a reverse iterator); else list(value) reversed.
  if (v.kind() == Value::Kind::kIterator) return Value::list(std::move(items));
  return Value::iterator(std::move(items), v.is_dict()                      ? "dict_reversekeyiterator"
                                           : v.kind() == Value::Kind::kList ? "list_reverseiterator"
                                                                            : "reversed");
}

Result<Value> f_sort(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"reverse", "case_sensitive", "attribute"}, "sort"));
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  std::vector<Value> keys;
  for (const Value& item : items) {
    Value k = item;
    if (b[2] && !b[2]->is_none()) {
      // "a,b": a tuple of several attributes (make_multi_attrgetter).
      const std::string spec = b[2]->is_string() ? b[2]->str() : "";
      if (spec.find(',') != std::string::npos) {
        std::vector<Value> parts;
        size_t start = 0;
        while (true) {
          const size_t comma = spec.find(',', start);
          LRA_ASSIGN_OR_RETURN(Value p, attribute_path(in, item, Value::string(spec.substr(start, comma - start))));
          parts.push_back(flag(b[1], false) ? p : ignore_case(p));
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
        keys.push_back(Value::tuple(std::move(parts)));
        continue;
      }
      LRA_ASSIGN_OR_RETURN(k, attribute_path(in, item, *b[2]));
    }
    keys.push_back(flag(b[1], false) ? k : ignore_case(k));
  }
  LRA_ASSIGN_OR_RETURN(std::vector<size_t> order, sorted_order(in, keys, flag(b[0], false)));
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Result<Value> f_string(Interp& in, const Value& v, const CallArgs& a) {
  LRA_RETURN_IF_ERROR(no_args(a, "string"));
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  return Value::string(std::move(s));
}

Result<Value> f_trim(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"chars"}, "trim"));
  LRA_ASSIGN_OR_RETURN(std::string s, in.str(v));
  std::optional<std::string> chars;
  if (b[0] && !b[0]->is_none()) {
    if (!b[0]->is_string()) return filter_error("TypeError: strip arg must be None or str");
    chars = b[0]->str();
  }
  return Value::string(py::strip(s, chars, true, true));
}

Result<Value> f_unique_body(Interp& in, const Value& v, const CallArgs& a) {
  LRA_ASSIGN_OR_RETURN(Bound b, bind_args(a, {"case_sensitive", "attribute"}, "unique"));
  LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  LRA_RETURN_IF_ERROR(in.charge(items.size()));
  std::unordered_set<std::string> seen;
  std::vector<Value> out;
  for (const Value& item : items) {
    Value k = item;
    if (b[1] && !b[1]->is_none()) {
      LRA_ASSIGN_OR_RETURN(k, attribute_path(in, item, *b[1]));
    }
    if (!flag(b[0], false)) k = ignore_case(k);
    auto h = hash_key(k);
    if (!h) return filter_error(fmt::format("TypeError: unhashable type: '{}'", k.type_name()));
    if (seen.insert(*h).second) out.push_back(item);
  }
  return Value::iterator(std::move(out), "generator");
}

// jinja2's generator filters do their work, and fail, only when iterated: an error becomes a
// generator that fails then. map and select* skip a false value (`if value:`) altogether.
Value generator(Result<Value> r) { return r.ok() ? std::move(r).value() : Value::failed_iterator(r.error()); }
Value guarded_generator(const Value& v, const std::function<Result<Value>()>& body) {
  if (!v.truthy()) return Value::iterator({}, "generator");
  return generator(body());
}

Result<Value> f_select(Interp& in, const Value& v, const CallArgs& a) {
  return guarded_generator(v, [&] { return select_common(in, v, a, true, false); });
}
Result<Value> f_reject(Interp& in, const Value& v, const CallArgs& a) {
  return guarded_generator(v, [&] { return select_common(in, v, a, false, false); });
}
Result<Value> f_selectattr(Interp& in, const Value& v, const CallArgs& a) {
  return guarded_generator(v, [&] { return select_common(in, v, a, true, true); });
}
Result<Value> f_rejectattr(Interp& in, const Value& v, const CallArgs& a) {
  return guarded_generator(v, [&] { return select_common(in, v, a, false, true); });
}
Result<Value> f_map(Interp& in, const Value& v, const CallArgs& a) {
  return guarded_generator(v, [&] { return f_map_body(in, v, a); });
}
Result<Value> f_unique(Interp& in, const Value& v, const CallArgs& a) { return generator(f_unique_body(in, v, a)); }
Result<Value> f_batch(Interp& in, const Value& v, const CallArgs& a) { return generator(f_batch_body(in, v, a)); }
Result<Value> f_items(Interp& in, const Value& v, const CallArgs& a) { return generator(f_items_body(in, v, a)); }

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = [] {
    std::unordered_map<std::string_view, FilterFn> t = {
        {"attr", f_attr},
        {"batch", f_batch},
        {"capitalize", string_filter<py::capitalize>},
        {"count", f_length},
        {"d", f_default},
        {"default", f_default},
        {"dictsort", f_dictsort},
        {"e", string_filter<html_escape>},
        {"escape", string_filter<html_escape>},
        {"first", f_first},
        {"format", f_format},
        {"indent", f_indent},
        {"items", f_items},
        {"join", f_join},
        {"last", f_last},
        {"length", f_length},
        {"list", f_list},
        {"lower", string_filter<py::lower>},
        {"map", f_map},
        {"max", f_max},
        {"min", f_min},
        {"reject", f_reject},
        {"rejectattr", f_rejectattr},
        {"replace", f_replace},
        {"reverse", f_reverse},
        {"safe", string_filter<identity>},
        {"select", f_select},
        {"selectattr", f_selectattr},
        {"sort", f_sort},
        {"string", f_string},
        {"title", string_filter<jinja_title>},
        {"trim", f_trim},
        {"unique", f_unique},
        {"upper", string_filter<py::upper>},
    };
    for (const auto& [name, fn] : number_filters()) t.emplace(name, fn);
    return t;
  }();
  return table;
}

}  // namespace

bool is_filter_name(std::string_view name) { return filters().count(name) != 0; }

Result<Value> apply_filter(Interp& in, const std::string& name, const Value& v, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) return filter_error(fmt::format("No filter named '{}'.", name));
  return it->second(in, v, args);
}

}  // namespace lragent::server::jinja
