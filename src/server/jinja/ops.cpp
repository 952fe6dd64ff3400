// Python's operators, iteration, slicing and string formatting (% and str.format) on Values.
#include <cmath>
#include <cstdio>
#include <limits>

#include "server/jinja/builtins.h"
#include "server/jinja/eval.h"
#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

namespace {

Error type_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, "TypeError: " + what}; }
Error value_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, what}; }

// An undefined operand fails as jinja2's Undefined does, with the reason it is undefined.
Error undefined_error(const Value& v) {
  return Error{ErrorCode::kInvalidArgument, v.str().empty() ? "value is undefined" : v.str()};
}

Error overflow() {
  return Error{ErrorCode::kInvalidArgument, "integer overflow (Python's ints are unbounded; lragent's are 64-bit)"};
}

const char* op_symbol(BinOp op) {
  switch (op) {
    case BinOp::kAdd: return "+";
    case BinOp::kSub: return "-";
    case BinOp::kMul: return "*";
    case BinOp::kDiv: return "/";
    case BinOp::kFloorDiv: return "//";
    case BinOp::kMod: return "%";
    case BinOp::kPow: return "**";
  }
  return "?";
}

// Python's float divmod (floatobject.c): the quotient floored, the remainder with the divisor's sign.
void float_divmod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

Result<Value> int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) return value_error("ZeroDivisionError: 0.0 cannot be raised to a negative power");
    return Value::number(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  if (base == 0 || base == 1) return Value::integer(exp == 0 ? 1 : base);
  if (base == -1) return Value::integer(exp % 2 ? -1 : 1);
  int64_t result = 1, b = base;
  while (exp > 0) {
    if (exp & 1)
      if (__builtin_mul_overflow(result, b, &result)) return overflow();
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(b, b, &b)) return overflow();
  }
  return Value::integer(result);
}

Result<Value> float_pow(double x, double y) {
  if (x == 0 && y < 0) return value_error("ZeroDivisionError: 0.0 cannot be raised to a negative power");
  if (x < 0 && std::isfinite(y) && y != std::floor(y))
    return value_error("a negative number to a fractional power is complex (not supported)");
  const double r = std::pow(x, y);
  if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
    return value_error("OverflowError: (34, 'Numerical result out of range')");
  return Value::number(r);
}

Result<Value> numeric_op(BinOp op, const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    switch (op) {
      case BinOp::kAdd:
        if (__builtin_add_overflow(x, y, &r)) return overflow();
        return Value::integer(r);
      case BinOp::kSub:
        if (__builtin_sub_overflow(x, y, &r)) return overflow();
        return Value::integer(r);
      case BinOp::kMul:
        if (__builtin_mul_overflow(x, y, &r)) return overflow();
        return Value::integer(r);
      case BinOp::kDiv:
        if (y == 0) return value_error("ZeroDivisionError: division by zero");
        return Value::number(static_cast<double>(x) / static_cast<double>(y));
      case BinOp::kFloorDiv:
      case BinOp::kMod: {
        if (y == 0) return value_error("ZeroDivisionError: integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == BinOp::kMod) return Value::integer(0);
          return overflow();
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::integer(op == BinOp::kFloorDiv ? q : m);
      }
      case BinOp::kPow: return int_pow(x, y);
    }
  }
  const double x = a.as_double(), y = b.as_double();
  switch (op) {
    case BinOp::kAdd: return Value::number(x + y);
    case BinOp::kSub: return Value::number(x - y);
    case BinOp::kMul: return Value::number(x * y);
    case BinOp::kDiv:
      if (y == 0) return value_error("ZeroDivisionError: float division by zero");
      return Value::number(x / y);
    case BinOp::kFloorDiv:
    case BinOp::kMod: {
      if (y == 0)
        return value_error(op == BinOp::kMod ? "ZeroDivisionError: float modulo"
                                             : "ZeroDivisionError: float floor division by zero");
      double fd, m;
      float_divmod(x, y, &fd, &m);
      return Value::number(op == BinOp::kFloorDiv ? fd : m);
    }
    case BinOp::kPow: return float_pow(x, y);
  }
  return type_error("unsupported operand");
}

Result<Value> repeat(Interp& in, const Value& seq, int64_t n) {
  if (n <= 0)
    return seq.is_string() ? Value::string("") : seq.kind() == Value::Kind::kList ? Value::list({}) : Value::tuple({});
  const size_t count = static_cast<size_t>(n);
  if (seq.is_string()) {
    const size_t len = seq.str().size();
    if (len != 0 && count > in.options().max_output_bytes / len)
      LRA_RETURN_IF_ERROR(in.check_bytes(in.options().max_output_bytes + 1));
    LRA_RETURN_IF_ERROR(in.charge(len * count / 64));
    std::string out;
    out.reserve(len * count);
    for (size_t i = 0; i < count && len; ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  const size_t len = seq.items().size();
  if (len != 0 && count > (size_t{1} << 40) / len) LRA_RETURN_IF_ERROR(in.check_items(size_t{1} << 40));
  LRA_RETURN_IF_ERROR(in.check_items(len * count));
  LRA_RETURN_IF_ERROR(in.charge(len * count / 16));
  std::vector<Value> items;
  items.reserve(len * count);
  for (size_t i = 0; i < count && len; ++i) items.insert(items.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == Value::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
}

}  // namespace

Result<Value> binary_op(Interp& in, BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return undefined_error(a);
  if (op == BinOp::kMod && a.is_string()) {
    // str.__mod__ runs first: an undefined argument fails only if a conversion reads it.
    LRA_ASSIGN_OR_RETURN(std::string s, percent_format(a.str(), b, in.options().max_output_bytes));
    LRA_RETURN_IF_ERROR(in.check_bytes(s.size()));
    return Value::string(std::move(s));
  }
  if (b.is_undefined()) return undefined_error(b);
  if (a.is_number() && b.is_number()) return numeric_op(op, a, b);
  if (op == BinOp::kAdd) {
    if (a.is_string() && b.is_string()) {
      LRA_RETURN_IF_ERROR(in.check_bytes(a.str().size() + b.str().size()));
      LRA_RETURN_IF_ERROR(in.charge((a.str().size() + b.str().size()) / 64));
      return Value::string(a.str() + b.str());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      LRA_RETURN_IF_ERROR(in.check_items(a.items().size() + b.items().size()));
      LRA_RETURN_IF_ERROR(in.charge((a.items().size() + b.items().size()) / 16));
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return a.kind() == Value::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    if (a.is_string()) return type_error(fmt::format("can only concatenate str (not \"{}\") to str", b.type_name()));
  }
  if (op == BinOp::kMul) {
    if ((a.is_string() || a.is_sequence()) && b.is_integral()) return repeat(in, a, b.as_int());
    if ((b.is_string() || b.is_sequence()) && a.is_integral()) return repeat(in, b, a.as_int());
  }
  return type_error(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op), a.type_name(), b.type_name()));
}

Result<Value> negate(const Value& v, bool minus) {
  if (v.is_undefined()) return undefined_error(v);
  if (v.is_integral()) {
    if (!minus) return Value::integer(v.as_int());
    if (v.as_int() == std::numeric_limits<int64_t>::min()) return overflow();
    return Value::integer(-v.as_int());
  }
  if (v.kind() == Value::Kind::kFloat) return Value::number(minus ? -v.as_double() : v.as_double());
  return type_error(fmt::format("bad operand type for unary {}: '{}'", minus ? "-" : "+", v.type_name()));
}

Result<bool> compare_op(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::kEq: return equals(a, b);
    case CmpOp::kNe: return !equals(a, b);
    case CmpOp::kIn: return contains(b, a);
    case CmpOp::kNotIn: {
      LRA_ASSIGN_OR_RETURN(bool c, contains(b, a));
      return !c;
    }
    default: break;
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  const char* sym = op == CmpOp::kLt ? "<" : op == CmpOp::kLe ? "<=" : op == CmpOp::kGt ? ">" : ">=";
  auto c = compare(a, b);
  if (!c.ok())
    return type_error(
        fmt::format("'{}' not supported between instances of '{}' and '{}'", sym, a.type_name(), b.type_name()));
  if (*c == 2) return false;  // a NaN
  switch (op) {
    case CmpOp::kLt: return *c < 0;
    case CmpOp::kLe: return *c <= 0;
    case CmpOp::kGt: return *c > 0;
    default: return *c >= 0;
  }
}

Result<std::vector<Value>> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return std::vector<Value>();
    case Value::Kind::kIterator:
      if (const Error* e = v.iterator_error()) return *e;
      return v.items();
    case Value::Kind::kList:
    case Value::Kind::kTuple: return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_data().size());
      for (const auto& [k, e] : v.dict_data().entries()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : py::decode(v.str())) chars.push_back(Value::string(py::encode(std::u32string(1, c))));
      return chars;
    }
    case Value::Kind::kLoop: return v.object_as<LoopObj>()->items;
    default: return type_error(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

Result<int64_t> length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return int64_t{0};
    case Value::Kind::kString: return static_cast<int64_t>(py::length(v.str()));
    case Value::Kind::kList:
    case Value::Kind::kTuple: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict_data().size());
    case Value::Kind::kLoop: return static_cast<int64_t>(v.object_as<LoopObj>()->items.size());
    default: return type_error(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

Result<bool> contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!needle.is_string())
        return type_error(fmt::format("'in <string>' requires string as left operand, not {}", needle.type_name()));
      return haystack.str().find(needle.str()) != std::string::npos;
    case Value::Kind::kIterator:
      if (const Error* e = haystack.iterator_error()) return *e;
      [[fallthrough]];
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& e : haystack.items())
        if (equals(e, needle)) return true;
      return false;
    case Value::Kind::kDict:
      if (!hash_key(needle)) return type_error(fmt::format("unhashable type: '{}'", needle.type_name()));
      return haystack.dict_data().find(needle) != nullptr;
    case Value::Kind::kLoop:
      for (const Value& e : haystack.object_as<LoopObj>()->items)
        if (equals(e, needle)) return true;
      return false;
    default: return type_error(fmt::format("argument of type '{}' is not iterable", haystack.type_name()));
  }
}

Result<Value> slice_value(Interp& in, const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
                          std::optional<int64_t> step_opt) {
  const int64_t step = step_opt.value_or(1);
  if (step == 0) return value_error("ValueError: slice step cannot be zero");
  std::u32string chars;
  const bool ascii = v.is_string() && py::is_ascii(v.str());
  if (v.is_string() && !ascii) chars = py::decode(v.str());
  const int64_t n = v.is_string() ? static_cast<int64_t>(ascii ? v.str().size() : chars.size())
                                  : static_cast<int64_t>(v.items().size());
  // PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> x, bool is_start) -> int64_t {
    if (!x) return is_start ? (step < 0 ? n - 1 : 0) : (step < 0 ? -1 : n);
    int64_t i = *x;
    if (i < 0) {
      i = i < -n ? -1 : i + n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(start, true), e = adjust(stop, false);
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t i = b; i < e; i += step) {
      idx.push_back(i);
      if (step > n) break;
    }
  } else {
    for (int64_t i = b; i > e; i += step) {
      idx.push_back(i);
      if (step < -n) break;
    }
  }
  LRA_RETURN_IF_ERROR(in.charge(idx.size() / 16));
  if (v.is_string()) {
    std::string out;
    for (int64_t i : idx) {
      if (ascii)
        out.push_back(v.str()[static_cast<size_t>(i)]);
      else
        py::append_utf8(out, chars[static_cast<size_t>(i)]);
    }
    return Value::string(std::move(out));
  }
  std::vector<Value> items;
  items.reserve(idx.size());
  for (int64_t i : idx) items.push_back(v.items()[static_cast<size_t>(i)]);
  return v.kind() == Value::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

}  // namespace lragent::server::jinja
