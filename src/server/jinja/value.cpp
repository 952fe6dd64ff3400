#include "server/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

namespace {

struct StrObj : Object {
  std::string s;
};

struct SeqObj : Object {
  std::vector<Value> items;
  std::string iterator_type;   // kIterator: Python's name for it
  std::optional<Error> error;  // kIterator: what iterating it fails with
  int depth = 1;
  bool has_ref = false;
};

struct DictObj : Object {
  DictData d;
  int depth = 1;
  bool has_ref = false;
};

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

const std::vector<Value>& empty_items() {
  static const std::vector<Value> empty;
  return empty;
}

// The exact double -> int64 conversion of an integral double in range (Python compares an int
// with a float exactly, not by rounding the int).
std::optional<int64_t> exact_int(double d) {
  if (!std::isfinite(d) || d != std::floor(d) || d < -9.2233720368547758e18 || d >= 9.2233720368547758e18)
    return std::nullopt;
  return static_cast<int64_t>(d);
}

// Compares two numbers (int, float or bool): -1, 0, 1, or 2 when a NaN makes them unordered.
int compare_numbers(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  const double x = a.as_double(), y = b.as_double();
  if (std::isnan(x) || std::isnan(y)) return 2;
  if (a.is_integral() || b.is_integral()) {
    // int vs float: exact when the float is an integral value in range.
    const Value& i = a.is_integral() ? a : b;
    const double f = a.is_integral() ? y : x;
    if (auto fi = exact_int(f)) {
      const int c = i.as_int() < *fi ? -1 : i.as_int() > *fi ? 1 : 0;
      return a.is_integral() ? c : -c;
    }
  }
  return x < y ? -1 : x > y ? 1 : 0;
}

}  // namespace

std::optional<std::string> hash_key(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString: return "s" + v.str();
    case Value::Kind::kInt:
    case Value::Kind::kBool: return "i" + std::to_string(v.as_int());
    case Value::Kind::kFloat:
      if (auto i = exact_int(v.as_double())) return "i" + std::to_string(*i);
      return "f" + py::repr_float(v.as_double());
    case Value::Kind::kNone: return std::string("n");
    case Value::Kind::kUndefined: return std::string("u");
    case Value::Kind::kTuple: {
      std::string k = "t" + std::to_string(v.items().size());
      for (const Value& e : v.items()) {
        auto ek = hash_key(e);
        if (!ek) return std::nullopt;
        k += ":" + std::to_string(ek->size()) + ":" + *ek;
      }
      return k;
    }
    case Value::Kind::kNamespace:
    case Value::Kind::kLoop:
    case Value::Kind::kIterator:
    case Value::Kind::kCallable:  // hashed by identity, as Python objects without __eq__ are
      return "p" + std::to_string(reinterpret_cast<uintptr_t>(v.object_as<Object>()));
    default: return std::nullopt;
  }
}

const Value* DictData::find(const Value& key) const {
  auto k = hash_key(key);
  if (!k) return nullptr;
  auto it = index_.find(*k);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

bool DictData::set(const Value& key, Value value) {
  auto k = hash_key(key);
  if (!k) return false;
  auto [it, inserted] = index_.emplace(*k, entries_.size());
  if (inserted)
    entries_.emplace_back(key, std::move(value));
  else
    entries_[it->second].second = std::move(value);
  return true;
}

Value Value::undefined(std::string hint) {
  Value v;
  auto o = std::make_shared<StrObj>();
  o->s = std::move(hint);
  v.obj_ = std::move(o);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.i_ = b ? 1 : 0;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  auto o = std::make_shared<StrObj>();
  o->s = std::move(s);
  v.obj_ = std::move(o);
  return v;
}

namespace {

Value make_seq(Value::Kind kind, std::vector<Value> items) {
  auto o = std::make_shared<SeqObj>();
  for (const Value& e : items) {
    o->depth = std::max(o->depth, e.depth() + 1);
    o->has_ref = o->has_ref || e.holds_ref();
  }
  o->items = std::move(items);
  return Value::object(kind, std::move(o));
}

}  // namespace

Value Value::list(std::vector<Value> items) { return make_seq(Kind::kList, std::move(items)); }
Value Value::iterator(std::vector<Value> items, std::string type_name) {
  Value v = make_seq(Kind::kIterator, std::move(items));
  static_cast<SeqObj*>(v.obj_.get())->iterator_type = std::move(type_name);
  return v;
}
Value Value::tuple(std::vector<Value> items) { return make_seq(Kind::kTuple, std::move(items)); }

Value Value::dict(DictData d) {
  auto o = std::make_shared<DictObj>();
  for (const auto& [k, e] : d.entries()) {
    o->depth = std::max(o->depth, e.depth() + 1);
    o->has_ref = o->has_ref || e.holds_ref();
  }
  o->d = std::move(d);
  return object(Kind::kDict, std::move(o));
}

Value Value::new_namespace(DictData attrs) {
  auto o = std::make_shared<DictObj>();
  o->d = std::move(attrs);
  return object(Kind::kNamespace, std::move(o));
}

Value Value::object(Kind kind, std::shared_ptr<Object> obj) {
  Value v;
  v.kind_ = kind;
  v.obj_ = std::move(obj);
  return v;
}

const std::string& Value::str() const {
  if ((kind_ == Kind::kString || kind_ == Kind::kUndefined) && obj_) return static_cast<StrObj*>(obj_.get())->s;
  return empty_string();
}

Value Value::failed_iterator(Error error) {
  Value v = iterator({}, "generator");
  static_cast<SeqObj*>(v.obj_.get())->error = std::move(error);
  return v;
}

const Error* Value::iterator_error() const {
  if (kind_ != Kind::kIterator) return nullptr;
  const auto& e = static_cast<SeqObj*>(obj_.get())->error;
  return e ? &*e : nullptr;
}

const std::vector<Value>& Value::items() const {
  if (is_sequence() || kind_ == Kind::kIterator) return static_cast<SeqObj*>(obj_.get())->items;
  return empty_items();
}

const DictData& Value::dict_data() const {
  if (kind_ == Kind::kNamespace) return namespace_attrs();
  assert(kind_ == Kind::kDict && "dict_data() of a value that is not a dict");
  return static_cast<DictObj*>(obj_.get())->d;
}

DictData& Value::namespace_attrs() const {
  assert(kind_ == Kind::kNamespace && "namespace_attrs() of a value that is not a namespace");
  return static_cast<DictObj*>(obj_.get())->d;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !str().empty();
    case Kind::kList:
    case Kind::kTuple: return !items().empty();
    case Kind::kDict: return dict_data().size() != 0;
    default: return true;
  }
}

int Value::depth() const {
  switch (kind_) {
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator: return static_cast<SeqObj*>(obj_.get())->depth;
    case Kind::kDict: return static_cast<DictObj*>(obj_.get())->depth;
    case Kind::kNamespace: {
      // Mutable, so measured now; it holds no namespace (the evaluator refuses one), so this is
      // one level over values whose depth is fixed.
      int d = 1;
      for (const auto& [k, e] : namespace_attrs().entries()) d = std::max(d, e.depth() + 1);
      return d;
    }
    default: return 0;
  }
}

bool Value::holds_ref() const {
  switch (kind_) {
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator: return static_cast<SeqObj*>(obj_.get())->has_ref;
    case Kind::kDict: return static_cast<DictObj*>(obj_.get())->has_ref;
    case Kind::kNamespace:
    case Kind::kLoop: return true;
    case Kind::kCallable: return obj_->holds_ref();  // a method bound to a loop holds the loop
    default: return false;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kLoop: return "LoopContext";
    case Kind::kCallable: return "function";
    case Kind::kIterator: return static_cast<SeqObj*>(obj_.get())->iterator_type;
  }
  return "object";
}

namespace {

// Past this depth a walk prints "..." instead of recursing (values deeper than kMaxValueDepth are
// refused when built; this only guards the stack).
constexpr int kMaxWalkDepth = 4 * kMaxValueDepth;

bool repr_at(std::string& out, const Value& v, int depth, size_t max_bytes);

bool dict_repr_at(std::string& out, const DictData& d, int depth, size_t max_bytes) {
  out.push_back('{');
  bool first = true;
  for (const auto& [k, e] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    if (!repr_at(out, k, depth + 1, max_bytes)) return false;
    out += ": ";
    if (!repr_at(out, e, depth + 1, max_bytes)) return false;
  }
  out.push_back('}');
  return out.size() <= max_bytes;
}

bool repr_at(std::string& out, const Value& v, int depth, size_t max_bytes) {
  if (depth > kMaxWalkDepth) {
    out += "...";
    return out.size() <= max_bytes;
  }
  switch (v.kind()) {
    case Value::Kind::kUndefined: out += "Undefined"; break;
    case Value::Kind::kString:
      if (out.size() + v.str().size() > max_bytes) return false;
      out += py::repr_string(v.str());
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const bool tuple = v.kind() == Value::Kind::kTuple;
      out.push_back(tuple ? '(' : '[');
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        if (!repr_at(out, items[i], depth + 1, max_bytes)) return false;
      }
      if (tuple && items.size() == 1) out.push_back(',');
      out.push_back(tuple ? ')' : ']');
      break;
    }
    case Value::Kind::kDict: return dict_repr_at(out, v.dict_data(), depth, max_bytes);
    case Value::Kind::kNamespace:
      out += "<Namespace ";
      if (!dict_repr_at(out, v.namespace_attrs(), depth, max_bytes)) return false;
      out += ">";
      break;
    case Value::Kind::kLoop:
    case Value::Kind::kCallable: out += v.object_as<Object>()->repr(); break;
    case Value::Kind::kIterator: out += "<" + v.type_name() + " object>"; break;
    default: return append_str(out, v, max_bytes);
  }
  return out.size() <= max_bytes;
}

}  // namespace

bool append_repr(std::string& out, const Value& v, size_t max_bytes) { return repr_at(out, v, 0, max_bytes); }

bool append_str(std::string& out, const Value& v, size_t max_bytes) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: break;
    case Value::Kind::kNone: out += "None"; break;
    case Value::Kind::kBool: out += v.as_bool() ? "True" : "False"; break;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); break;
    case Value::Kind::kFloat: out += py::repr_float(v.as_double()); break;
    case Value::Kind::kString:
      if (out.size() + v.str().size() > max_bytes) return false;
      out += v.str();
      break;
    default: return repr_at(out, v, 0, max_bytes);
  }
  return out.size() <= max_bytes;
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v, static_cast<size_t>(-1));
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v, static_cast<size_t>(-1));
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const DictData &x = a.dict_data(), &y = b.dict_data();
      if (x.size() != y.size()) return false;
      for (const auto& [k, e] : x.entries()) {
        const Value* other = y.find(k);
        if (!other || !equals(e, *other)) return false;
      }
      return true;
    }
    default: return a.object_as<Object>() == b.object_as<Object>();
  }
}

Result<int> compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b);
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind() == b.kind() && a.is_sequence()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return make_error(ErrorCode::kInvalidArgument, "TypeError: ordering not supported between instances of '{}' and '{}'",
                    a.type_name(), b.type_name());
}

namespace {

struct JsonWriter {
  const JsonOptions& o;
  std::string item_sep, key_sep;
  std::string out;

  void write_string(const std::string& s) {
    if (!o.ensure_ascii) {
      py::append_json_string(out, s);
      return;
    }
    out.push_back('"');
    for (char32_t c : py::decode(s)) {
      if (c < 0x80) {
        std::string one;
        py::append_json_string(one, std::string(1, static_cast<char>(c)));
        out.append(one, 1, one.size() - 2);
        continue;
      }
      auto unit = [&](unsigned u) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u%04x", u);
        out += buf;
      };
      if (c >= 0x10000) {
        unit(0xD800 + ((c - 0x10000) >> 10));
        unit(0xDC00 + ((c - 0x10000) & 0x3FF));
      } else {
        unit(c);
      }
    }
    out.push_back('"');
  }

  Status check_size() const {
    if (out.size() > o.max_bytes)
      return make_error(ErrorCode::kInvalidArgument, "tojson output is larger than {} bytes", o.max_bytes);
    return Status::Ok();
  }

  void newline(int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *o.indent;
  }

  Status write_number(const Value& v) {
    if (v.kind() == Value::Kind::kBool)
      out += v.as_bool() ? "true" : "false";
    else if (v.is_int())
      out += std::to_string(v.as_int());
    else {
      const double d = v.as_double();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d < 0 ? "-Infinity" : "Infinity";
      else
        out += py::repr_float(d);
    }
    return Status::Ok();
  }

  Status write_key(const Value& k) {
    if (k.is_string())
      write_string(k.str());
    else if (k.is_none())
      out += "\"null\"";
    else if (k.is_number()) {
      out.push_back('"');
      LRA_RETURN_IF_ERROR(write_number(k));
      out.push_back('"');
    } else {
      return make_error(ErrorCode::kInvalidArgument, "TypeError: keys must be str, int, float, bool or None, not {}",
                        k.type_name());
    }
    return Status::Ok();
  }

  Status write(const Value& v, int level) {
    if (level > kMaxWalkDepth) return make_error(ErrorCode::kInvalidArgument, "tojson: value nested too deeply");
    switch (v.kind()) {
      case Value::Kind::kNone: out += "null"; return Status::Ok();
      case Value::Kind::kBool:
      case Value::Kind::kInt:
      case Value::Kind::kFloat: return write_number(v);
      case Value::Kind::kString: write_string(v.str()); return check_size();
      case Value::Kind::kList:
      case Value::Kind::kTuple: {
        const auto& items = v.items();
        if (items.empty()) {
          out += "[]";
          return Status::Ok();
        }
        out.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (o.indent) newline(level + 1);
          LRA_RETURN_IF_ERROR(write(items[i], level + 1));
          LRA_RETURN_IF_ERROR(check_size());
        }
        if (o.indent) newline(level);
        out.push_back(']');
        return Status::Ok();
      }
      case Value::Kind::kDict: {
        std::vector<const std::pair<Value, Value>*> entries;
        for (const auto& e : v.dict_data().entries()) entries.push_back(&e);
        if (entries.empty()) {
          out += "{}";
          return Status::Ok();
        }
        if (o.sort_keys) {
          // Python sorts the items by key first, so keys of mixed types are a TypeError.
          std::optional<Error> err;
          std::stable_sort(entries.begin(), entries.end(), [&](auto* x, auto* y) {
            auto c = compare(x->first, y->first);
            if (!c.ok()) {
              if (!err) err = c.error();
              return false;
            }
            return *c < 0;
          });
          if (err) return *err;
        }
        out.push_back('{');
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_sep;
          if (o.indent) newline(level + 1);
          LRA_RETURN_IF_ERROR(write_key(entries[i]->first));
          out += key_sep;
          LRA_RETURN_IF_ERROR(write(entries[i]->second, level + 1));
          LRA_RETURN_IF_ERROR(check_size());
        }
        if (o.indent) newline(level);
        out.push_back('}');
        return Status::Ok();
      }
      default:
        return make_error(ErrorCode::kInvalidArgument, "TypeError: Object of type {} is not JSON serializable",
                          v.type_name());
    }
  }
};

}  // namespace

Result<std::string> dump_json(const Value& v, const JsonOptions& options) {
  JsonWriter w{options, options.indent ? "," : ", ", ": ", {}};
  if (options.separators) {
    w.item_sep = options.separators->first;
    w.key_sep = options.separators->second;
  }
  LRA_RETURN_IF_ERROR(w.write(v, 0));
  return std::move(w.out);
}

namespace {

Result<Value> from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth)
    return make_error(ErrorCode::kInvalidArgument, "template variables nest deeper than {} levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return make_error(ErrorCode::kInvalidArgument, "template variable integer {} is past int64", u);
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        LRA_ASSIGN_OR_RETURN(Value v, from_json_at(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      for (const auto& [k, e] : j.items()) {
        LRA_ASSIGN_OR_RETURN(Value v, from_json_at(e, depth + 1));
        d.set(Value::string(k), std::move(v));
      }
      return Value::dict(std::move(d));
    }
    default:
      return make_error(ErrorCode::kInvalidArgument, "template variables hold a value JSON text cannot (binary)");
  }
}

Result<nlohmann::ordered_json> to_json_at(const Value& v, int depth) {
  if (depth > kMaxWalkDepth) return make_error(ErrorCode::kInvalidArgument, "value nested too deeply for JSON");
  switch (v.kind()) {
    case Value::Kind::kNone: return nlohmann::ordered_json(nullptr);
    case Value::Kind::kBool: return nlohmann::ordered_json(v.as_bool());
    case Value::Kind::kInt: return nlohmann::ordered_json(v.as_int());
    case Value::Kind::kFloat: return nlohmann::ordered_json(v.as_double());
    case Value::Kind::kString: return nlohmann::ordered_json(v.str());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      auto arr = nlohmann::ordered_json::array();
      for (const Value& e : v.items()) {
        LRA_ASSIGN_OR_RETURN(auto je, to_json_at(e, depth + 1));
        arr.push_back(std::move(je));
      }
      return arr;
    }
    case Value::Kind::kDict: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.dict_data().entries()) {
        if (!k.is_string())
          return make_error(ErrorCode::kInvalidArgument, "a dict key of type {} has no JSON form", k.type_name());
        LRA_ASSIGN_OR_RETURN(auto je, to_json_at(e, depth + 1));
        obj[k.str()] = std::move(je);
      }
      return obj;
    }
    default: return make_error(ErrorCode::kInvalidArgument, "a value of type {} has no JSON form", v.type_name());
  }
}

}  // namespace

Result<Value> from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }
Result<nlohmann::ordered_json> to_json(const Value& v) { return to_json_at(v, 0); }

}  // namespace lragent::server::jinja
