#include "server/jinja/eval.h"

#include <algorithm>

#include "server/jinja/pystr.h"

namespace lragent::server::jinja {

namespace {

// Errors that already name their place in the template start with this; an error from deeper
// down gets the position of the innermost expression or statement it passes through.
constexpr std::string_view kLocated = "template error at ";
// The evaluator's own recursion (nested expressions, statements and macro bodies together), in
// calls and in stack bytes: rendering needs this much stack beyond the caller's.
constexpr int kMaxFrames = 3000;
constexpr uintptr_t kMaxStackBytes = uintptr_t{1} << 20;

uintptr_t stack_address() { return reinterpret_cast<uintptr_t>(__builtin_frame_address(0)); }

Error locate(Error e, int line, int column) {
  if (e.message.rfind(kLocated, 0) == 0) return e;
  e.message = std::string(kLocated) + describe_position(line, column) + ": " + e.message;
  return e;
}

Error render_error(const std::string& what) { return Error{ErrorCode::kInvalidArgument, what}; }

const Value* lookup(const Scope* s, const std::string& name) {
  for (; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

Value bound_method(const Value& self, const std::string& name) {
  auto c = std::make_shared<Callable>();
  c->kind = Callable::Kind::kMethod;
  c->name = name;
  c->self = self;
  return Value::object(Value::Kind::kCallable, std::move(c));
}

// Python values jinja2's optimizer can write into compiled code (has_safe_repr): a constant it
// folded to anything else (an undefined, a generator) is evaluated at run time instead.
bool safe_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
    case Value::Kind::kString: return true;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& e : v.items())
        if (!safe_repr(e)) return false;
      return true;
    case Value::Kind::kDict:
      for (const auto& [k, e] : v.dict_data().entries())
        if (!safe_repr(k) || !safe_repr(e)) return false;
      return true;
    default: return false;
  }
}

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
}

}  // namespace

std::string Callable::repr() const {
  if (kind == Kind::kMacro) return fmt::format("<Macro '{}'>", name);
  if (kind == Kind::kMethod) return fmt::format("<built-in method {} of {} object>", name, self.type_name());
  return fmt::format("<function {}>", name);
}

std::string LoopObj::repr() const { return fmt::format("<LoopContext {}/{}>", index + 1, items.size()); }

bool Interp::too_deep() const {
  // The stack grows down on every platform this builds for.
  return frames_ > kMaxFrames || stack_base_ - stack_address() > kMaxStackBytes;
}

Status Interp::charge(size_t work) {
  steps_ += static_cast<int64_t>(std::min<size_t>(work, static_cast<size_t>(opt_.max_steps) + 1));
  if (steps_ > opt_.max_steps)
    return render_error(fmt::format("the template ran past {} evaluation steps", opt_.max_steps));
  return Status::Ok();
}

Status Interp::check_bytes(size_t bytes) const {
  if (bytes > opt_.max_output_bytes)
    return render_error(fmt::format("the template built a string past {} bytes", opt_.max_output_bytes));
  return Status::Ok();
}

Status Interp::check_items(size_t items) const {
  // A list item is a few dozen bytes: a list is held to a sixteenth of the output limit in items.
  const size_t limit = std::max<size_t>(opt_.max_output_bytes / 16, 1024);
  if (items > limit) return render_error(fmt::format("the template built a list of more than {} items", limit));
  return Status::Ok();
}

Status Interp::check_value(const Value& v) const {
  if (v.depth() > kMaxValueDepth)
    return render_error(fmt::format("the template built a value nested deeper than {} levels", kMaxValueDepth));
  return Status::Ok();
}

Result<std::string> Interp::str(const Value& v) const {
  if (v.is_string()) return v.str();
  std::string out;
  if (!append_str(out, v, opt_.max_output_bytes)) LRA_RETURN_IF_ERROR(check_bytes(opt_.max_output_bytes + 1));
  return out;
}

Status Interp::check_output(const std::string& out) const {
  if (out.size() > opt_.max_output_bytes)
    return render_error(fmt::format("the output passed {} bytes", opt_.max_output_bytes));
  return Status::Ok();
}

Status Interp::append_output(std::string& out, const Value& v) const {
  if (!append_str(out, v, opt_.max_output_bytes))
    return render_error(fmt::format("the output passed {} bytes", opt_.max_output_bytes));
  return Status::Ok();
}

Result<std::string> Interp::render(const StmtList& program, const nlohmann::ordered_json& variables) {
  if (!variables.is_object()) return render_error("the template variables must be a JSON object");
  stack_base_ = stack_address();
  auto globals = std::make_shared<Scope>();
  for (const char* name : global_names()) {
    auto c = std::make_shared<Callable>();
    c->name = name;
    globals->vars[name] = Value::object(Value::Kind::kCallable, std::move(c));
  }
  auto root = child_of(globals);
  for (const auto& [name, j] : variables.items()) {
    LRA_ASSIGN_OR_RETURN(Value v, from_json(j));
    root->vars[name] = std::move(v);
  }
  std::string out;
  LRA_ASSIGN_OR_RETURN(Flow flow, exec_list(program, root, out));
  (void)flow;  // the parser allows break and continue only inside loops
  return out;
}

Result<Interp::Flow> Interp::exec_list(const StmtList& list, const ScopePtr& scope, std::string& out) {
  for (const auto& s : list) {
    LRA_ASSIGN_OR_RETURN(Flow f, exec(*s, scope, out));
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Result<Interp::Flow> Interp::exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
  Frame frame(this);
  if (too_deep()) return locate(render_error("the template nests too deeply"), s.line, s.column);
  auto st = charge(1);
  if (!st.ok()) return locate(st.error(), s.line, s.column);
  auto located = [&](Error e) -> Result<Flow> { return locate(std::move(e), s.line, s.column); };
  switch (s.kind) {
    case StmtKind::kData:
      out += s.text;
      if (auto c = check_output(out); !c.ok()) return located(c.error());
      return Flow::kNormal;
    case StmtKind::kOutput: {
      if (s.expr->constant && s.expr->kind != ExprKind::kConst) {
        // jinja2 prints a constant it can evaluate while compiling, whatever the value.
        folding_ = true;
        auto folded = eval_inner(*s.expr, scope);
        folding_ = false;
        if (folded.ok()) {
          if (auto c = append_output(out, *folded); !c.ok()) return located(c.error());
          return Flow::kNormal;
        }
      }
      LRA_ASSIGN_OR_RETURN(Value v, eval(*s.expr, scope));
      if (auto c = append_output(out, v); !c.ok()) return located(c.error());
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (const auto& [test, body] : s.branches) {
        LRA_ASSIGN_OR_RETURN(Value t, eval(*test, scope));
        if (t.truthy()) return exec_list(body, scope, out);
      }
      return exec_list(s.else_body, scope, out);
    case StmtKind::kFor: return exec_for(s, scope, out);
    case StmtKind::kSet: {
      LRA_ASSIGN_OR_RETURN(Value v, eval(*s.expr, scope));
      if (auto a = assign(s.target, v, *scope); !a.ok()) return located(a.error());
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      // The body renders in a scope of its own (jinja2's inner frame), then goes through the filters.
      std::string body;
      LRA_ASSIGN_OR_RETURN(Flow f, exec_list(s.body, child_of(scope), body));
      (void)f;
      Value v = Value::string(std::move(body));
      if (s.filter) {
        const Value input = v;
        LRA_ASSIGN_OR_RETURN(v, eval_filter(*s.filter, scope, &input));
      }
      if (s.kind == StmtKind::kFilterBlock) {
        if (auto c = append_output(out, v); !c.ok()) return located(c.error());
      } else if (auto a = assign(s.target, v, *scope); !a.ok()) {
        return located(a.error());
      }
      return Flow::kNormal;
    }
    case StmtKind::kMacro: {
      auto c = std::make_shared<Callable>();
      c->kind = Callable::Kind::kMacro;
      c->name = s.name;
      c->macro = &s;
      c->closure = scope;
      scope->vars[s.name] = Value::object(Value::Kind::kCallable, std::move(c));
      return Flow::kNormal;
    }
    case StmtKind::kCallBlock: {
      auto c = std::make_shared<Callable>();
      c->kind = Callable::Kind::kMacro;
      c->name = "caller";
      c->macro = &s;
      c->closure = scope;
      const Value caller = Value::object(Value::Kind::kCallable, std::move(c));
      LRA_ASSIGN_OR_RETURN(Value v, eval_call(*s.expr, scope, &caller));
      if (auto a = append_output(out, v); !a.ok()) return located(a.error());
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      auto inner = child_of(scope);
      std::vector<Value> values;
      for (const auto& e : s.values) {
        LRA_ASSIGN_OR_RETURN(Value v, eval(*e, scope));
        values.push_back(std::move(v));
      }
      for (size_t i = 0; i < values.size(); ++i)
        if (auto a = assign(s.targets[i], values[i], *inner); !a.ok()) return located(a.error());
      return exec_list(s.body, inner, out);
    }
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
    case StmtKind::kBody: return exec_list(s.body, child_of(scope), out);
  }
  return Flow::kNormal;
}

Result<Interp::Flow> Interp::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  LRA_ASSIGN_OR_RETURN(Value iterable, eval(*s.expr, scope));
  auto items = iterate(iterable);
  if (!items.ok()) return locate(items.error(), s.expr->line, s.expr->column);
  if (s.test) {
    // The inline filter sees the loop variable, not `loop`: it decides what the loop runs over.
    auto test_scope = child_of(scope);
    std::vector<Value> kept;
    for (Value& item : *items) {
      test_scope->vars.clear();
      if (auto a = assign(s.target, item, *test_scope); !a.ok()) return locate(a.error(), s.line, s.column);
      LRA_ASSIGN_OR_RETURN(Value t, eval(*s.test, test_scope));
      if (t.truthy()) kept.push_back(std::move(item));
    }
    *items = std::move(kept);
  }
  auto loop = std::make_shared<LoopObj>();
  loop->items = std::move(*items);
  const Value loop_value = Value::object(Value::Kind::kLoop, loop);
  auto body_scope = child_of(scope);
  // jinja2 marks an iteration done at the end of the body, so the else body runs when none got
  // there: no items, or every iteration left by break or continue.
  bool completed = false;
  for (size_t i = 0; i < loop->items.size(); ++i) {
    // Each iteration starts afresh: what the body set in the last one is gone, as in jinja2.
    body_scope->vars.clear();
    loop->index = i;
    body_scope->vars["loop"] = loop_value;
    if (auto a = assign(s.target, loop->items[i], *body_scope); !a.ok()) return locate(a.error(), s.line, s.column);
    LRA_ASSIGN_OR_RETURN(Flow f, exec_list(s.body, body_scope, out));
    if (f == Flow::kBreak) break;
    if (f == Flow::kNormal) completed = true;
  }
  if (!completed && !s.else_body.empty()) return exec_list(s.else_body, child_of(scope), out);
  return Flow::kNormal;
}

Status Interp::assign(const Target& t, const Value& v, Scope& scope) {
  switch (t.kind) {
    case Target::Kind::kName: scope.vars[t.name] = v; return Status::Ok();
    case Target::Kind::kNsAttr: {
      const Value* ns = lookup(&scope, t.name);
      if (!ns || ns->kind() != Value::Kind::kNamespace)
        return render_error("cannot assign attribute on non-namespace object");
      // A namespace holding a namespace (or a loop, which holds its items) could hold itself.
      if (v.holds_ref()) return render_error("a namespace attribute cannot hold a namespace or a loop object here");
      if (v.depth() + 1 > kMaxValueDepth) LRA_RETURN_IF_ERROR(check_value(Value::list({v})));
      ns->namespace_attrs().set(Value::string(t.attr), v);
      return Status::Ok();
    }
    case Target::Kind::kTuple: {
      LRA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
      if (items.size() > t.items.size())
        return render_error(fmt::format("ValueError: too many values to unpack (expected {})", t.items.size()));
      if (items.size() < t.items.size())
        return render_error(
            fmt::format("ValueError: not enough values to unpack (expected {}, got {})", t.items.size(), items.size()));
      for (size_t i = 0; i < items.size(); ++i) LRA_RETURN_IF_ERROR(assign(t.items[i], items[i], scope));
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Result<Value> Interp::eval(const Expr& e, const ScopePtr& scope) {
  Frame frame(this);
  if (too_deep()) return locate(render_error("the template nests too deeply"), e.line, e.column);
  auto st = charge(1);
  if (!st.ok()) return locate(st.error(), e.line, e.column);
  if (e.constant && !folding_ && e.kind != ExprKind::kConst) {
    // jinja2 folds a constant expression while compiling when the value can be written into
    // Python code; otherwise (or when folding fails) it evaluates it at run time.
    folding_ = true;
    auto folded = eval_inner(e, scope);
    folding_ = false;
    if (folded.ok() && safe_repr(*folded)) return folded;
  }
  auto r = eval_inner(e, scope);
  if (!r.ok()) return locate(r.error(), e.line, e.column);
  return r;
}

Result<Value> Interp::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kConst: return e.value;
    case ExprKind::kName: {
      if (const Value* v = lookup(scope.get(), e.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::kNsRef: return render_error("a namespace reference is only an assignment target");
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) {
        LRA_ASSIGN_OR_RETURN(Value v, eval(*c, scope));
        items.push_back(std::move(v));
      }
      Value v = e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      LRA_RETURN_IF_ERROR(check_value(v));
      return v;
    }
    case ExprKind::kDict: {
      DictData d;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        LRA_ASSIGN_OR_RETURN(Value k, eval(*e.children[i], scope));
        LRA_ASSIGN_OR_RETURN(Value v, eval(*e.children[i + 1], scope));
        if (!d.set(k, std::move(v)))
          return render_error(fmt::format("TypeError: unhashable type: '{}'", k.type_name()));
      }
      Value v = Value::dict(std::move(d));
      LRA_RETURN_IF_ERROR(check_value(v));
      return v;
    }
    case ExprKind::kGetattr: {
      LRA_ASSIGN_OR_RETURN(Value obj, eval(*e.children[0], scope));
      return getattr(obj, e.name);
    }
    case ExprKind::kGetitem: return eval_getitem(e, scope);
    case ExprKind::kSlice: return render_error("a slice is only an index");
    case ExprKind::kCall: return eval_call(e, scope, nullptr);
    case ExprKind::kFilter: return eval_filter(e, scope, nullptr);
    case ExprKind::kTest: {
      LRA_ASSIGN_OR_RETURN(Value v, eval(*e.children[0], scope));
      LRA_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
      LRA_ASSIGN_OR_RETURN(bool b, apply_test(*this, e.name, v, args));
      return Value::boolean(b);
    }
    case ExprKind::kNot: {
      LRA_ASSIGN_OR_RETURN(Value v, eval(*e.children[0], scope));
      return Value::boolean(!v.truthy());
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      LRA_ASSIGN_OR_RETURN(Value v, eval(*e.children[0], scope));
      return negate(v, e.kind == ExprKind::kNeg);
    }
    case ExprKind::kBinary: {
      LRA_ASSIGN_OR_RETURN(Value a, eval(*e.children[0], scope));
      LRA_ASSIGN_OR_RETURN(Value b, eval(*e.children[1], scope));
      return binary_op(*this, e.op, a, b);
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      // Python's and/or give one of their operands, not a bool.
      LRA_ASSIGN_OR_RETURN(Value a, eval(*e.children[0], scope));
      if (a.truthy() == (e.kind == ExprKind::kOr)) return a;
      return eval(*e.children[1], scope);
    }
    case ExprKind::kCompare: {
      LRA_ASSIGN_OR_RETURN(Value left, eval(*e.children[0], scope));
      for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
        LRA_ASSIGN_OR_RETURN(Value right, eval(*e.children[i + 1], scope));
        LRA_ASSIGN_OR_RETURN(bool ok, compare_op(e.cmp_ops[i], left, right));
        if (!ok) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kConcat: {
      std::string s;
      for (const auto& c : e.children) {
        LRA_ASSIGN_OR_RETURN(Value v, eval(*c, scope));
        if (!append_str(s, v, opt_.max_output_bytes)) LRA_RETURN_IF_ERROR(check_bytes(opt_.max_output_bytes + 1));
      }
      return Value::string(std::move(s));
    }
    case ExprKind::kCondExpr: {
      LRA_ASSIGN_OR_RETURN(Value cond, eval(*e.children[1], scope));
      if (cond.truthy()) return eval(*e.children[0], scope);
      if (e.children[2]) return eval(*e.children[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  return render_error("unknown expression");
}

Result<Value> Interp::eval_getitem(const Expr& e, const ScopePtr& scope) {
  LRA_ASSIGN_OR_RETURN(Value obj, eval(*e.children[0], scope));
  const Expr& index = *e.children[1];
  if (index.kind != ExprKind::kSlice) {
    LRA_ASSIGN_OR_RETURN(Value key, eval(index, scope));
    return getitem(obj, key);
  }
  // jinja2 compiles a slice to a plain Python subscript (not the sandbox's getitem), so what
  // cannot be sliced is an error, not undefined; but its optimizer folds a constant one through
  // the sandbox's getitem, which makes the failure undefined.
  auto fail = [&](const std::string& what) -> Result<Value> {
    if (folding_) return Value::undefined(what);
    return render_error("TypeError: " + what);
  };
  if (obj.is_undefined()) return render_error(obj.str().empty() ? "value is undefined" : obj.str());
  std::optional<int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (!index.children[i]) continue;
    LRA_ASSIGN_OR_RETURN(Value b, eval(*index.children[i], scope));
    if (b.is_none()) continue;
    if (!b.is_integral()) return fail("slice indices must be integers or None or have an __index__ method");
    bounds[i] = b.as_int();
  }
  if (!obj.is_sequence() && !obj.is_string())
    return fail(fmt::format("'{}' object is not subscriptable", obj.type_name()));
  return slice_value(*this, obj, bounds[0], bounds[1], bounds[2]);
}

Result<CallArgs> Interp::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  const size_t npos = e.positional_count();
  for (size_t i = 0; i < e.children.size() - 1; ++i) {
    LRA_ASSIGN_OR_RETURN(Value v, eval(*e.children[i + 1], scope));
    if (i < npos)
      args.pos.push_back(std::move(v));
    else
      args.kw.emplace_back(e.kw_names[i - npos], std::move(v));
  }
  if (e.dyn_args) {
    LRA_ASSIGN_OR_RETURN(Value v, eval(*e.dyn_args, scope));
    LRA_ASSIGN_OR_RETURN(std::vector<Value> more, iterate(v));
    for (Value& m : more) args.pos.push_back(std::move(m));
  }
  if (e.dyn_kwargs) {
    LRA_ASSIGN_OR_RETURN(Value v, eval(*e.dyn_kwargs, scope));
    if (!v.is_dict()) return render_error("TypeError: argument after ** must be a mapping");
    for (const auto& [k, x] : v.dict_data().entries()) {
      if (!k.is_string()) return render_error("TypeError: keywords must be strings");
      args.kw.emplace_back(k.str(), x);
    }
  }
  return args;
}

Result<Value> Interp::eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
  LRA_ASSIGN_OR_RETURN(Value callee, eval(*e.children[0], scope));
  LRA_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
  if (caller) args.kw.emplace_back("caller", *caller);
  return call(callee, args);
}

// `input`: the value a {% filter %} or {% set x | f %} body rendered, for the innermost filter.
Result<Value> Interp::eval_filter(const Expr& e, const ScopePtr& scope, const Value* input) {
  Value v;
  if (input && e.children[0]) {
    LRA_ASSIGN_OR_RETURN(v, eval_filter(*e.children[0], scope, input));  // further down the chain
  } else if (e.children[0]) {
    LRA_ASSIGN_OR_RETURN(v, eval(*e.children[0], scope));
  } else if (input) {
    v = *input;
  }
  LRA_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
  return apply_filter(*this, e.name, v, args);
}

Result<Value> Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: return render_error(obj.str().empty() ? "value is undefined" : obj.str());
    case Value::Kind::kNamespace: {
      if (const Value* v = obj.namespace_attrs().find(Value::string(name))) return *v;
      return no_attribute(obj, name);
    }
    case Value::Kind::kLoop: return loop_attr(obj, name);
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      // The attributes Python's numbers have (a number has no methods a template would call).
      if (name == "real") return obj.is_integral() ? Value::integer(obj.as_int()) : obj;
      if (name == "imag") return obj.is_integral() ? Value::integer(0) : Value::number(0.0);
      if (obj.is_integral() && name == "numerator") return Value::integer(obj.as_int());
      if (obj.is_integral() && name == "denominator") return Value::integer(1);
      return no_attribute(obj, name);
    default: break;
  }
  switch (method_kind(obj, name)) {
    case MethodKind::kSafe: return bound_method(obj, name);
    case MethodKind::kUnsafe:
      return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name()));
    case MethodKind::kNone: break;
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().find(Value::string(name))) return *v;
  }
  return no_attribute(obj, name);
}

Result<Value> Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: return render_error(obj.str().empty() ? "value is undefined" : obj.str());
    case Value::Kind::kDict:
      if (const Value* v = obj.dict_data().find(key)) return *v;
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kString:
      if (key.is_integral()) {
        const int64_t n =
            obj.is_string() ? static_cast<int64_t>(py::length(obj.str())) : static_cast<int64_t>(obj.items().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n)
          return Value::undefined(fmt::format("'{} object' has no element {}", obj.type_name(), key.as_int()));
        if (!obj.is_string()) return obj.items()[static_cast<size_t>(i)];
        return slice_value(*this, obj, i, i + 1, std::nullopt);
      }
      break;
    default: break;
  }
  // As jinja2's sandbox: an item lookup that fails falls back to the attribute of that name.
  if (key.is_string()) return getattr(obj, key.str());
  return Value::undefined(fmt::format("'{} object' has no element {}", obj.type_name(), to_str(key).substr(0, 64)));
}

Result<Value> Interp::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return render_error(callee.str().empty() ? "value is undefined" : callee.str());
  if (callee.kind() != Value::Kind::kCallable)
    return render_error(fmt::format("TypeError: '{}' object is not callable", callee.type_name()));
  const Callable& c = *callee.object_as<Callable>();
  switch (c.kind) {
    case Callable::Kind::kGlobal: return call_global(*this, c.name, args);
    case Callable::Kind::kMacro: return call_macro(c, args);
    case Callable::Kind::kJoiner: {
      if (!args.pos.empty() || !args.kw.empty()) return render_error("TypeError: a joiner takes no arguments");
      auto& j = *callee.object_as<Callable>();
      const bool first = !j.joined;
      j.joined = true;
      return Value::string(first ? "" : j.name);
    }
    case Callable::Kind::kMethod:
      if (c.self.kind() == Value::Kind::kLoop) return call_loop_method(c, args);
      return call_method(*this, c.self, c.name, args);
  }
  return render_error("not callable");
}

// jinja2's Macro.__call__: positional arguments, then parameters by name; extra ones go to
// varargs / kwargs only when the body reads them; a missing one takes its default or is undefined.
Result<Value> Interp::call_macro(const Callable& m, const CallArgs& args) {
  auto closure = m.closure.lock();
  if (!closure) return render_error(fmt::format("macro '{}' was called after the scope that defined it ended", m.name));
  const Stmt& def = *m.macro;
  if (macro_depth_ >= opt_.max_depth)
    return render_error(fmt::format("macro calls nest deeper than {} (runaway recursion?)", opt_.max_depth));
  const size_t n = def.params.size();
  auto sc = child_of(closure);
  std::vector<std::optional<Value>> vals(n);
  for (size_t i = 0; i < n && i < args.pos.size(); ++i) vals[i] = args.pos[i];
  std::vector<std::pair<std::string, Value>> kwargs = args.kw;
  bool found_caller = false;
  if (args.pos.size() < n) {
    for (size_t i = args.pos.size(); i < n; ++i) {
      auto it = std::find_if(kwargs.begin(), kwargs.end(), [&](const auto& kv) { return kv.first == def.params[i]; });
      if (it != kwargs.end()) {
        vals[i] = it->second;
        kwargs.erase(it);
      }
      if (def.params[i] == "caller") found_caller = true;
    }
  } else {
    found_caller = std::find(def.params.begin(), def.params.end(), "caller") != def.params.end();
  }
  if (def.uses_caller && !found_caller) {
    auto it = std::find_if(kwargs.begin(), kwargs.end(), [](const auto& kv) { return kv.first == "caller"; });
    if (it != kwargs.end()) {
      sc->vars["caller"] = it->second;
      kwargs.erase(it);
    } else {
      sc->vars["caller"] = Value::undefined("No caller defined");
    }
  }
  if (def.uses_kwargs) {
    DictData d;
    for (auto& [k, v] : kwargs) d.set(Value::string(k), std::move(v));
    sc->vars["kwargs"] = Value::dict(std::move(d));
  } else if (!kwargs.empty()) {
    return render_error(fmt::format("TypeError: macro '{}' takes no keyword argument '{}'", m.name, kwargs[0].first));
  }
  if (def.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = n; i < args.pos.size(); ++i) rest.push_back(args.pos[i]);
    sc->vars["varargs"] = Value::tuple(std::move(rest));
  } else if (args.pos.size() > n) {
    return render_error(fmt::format("TypeError: macro '{}' takes not more than {} argument(s)", m.name, n));
  }
  ++macro_depth_;
  struct Leave {
    int& depth;
    ~Leave() { --depth; }
  } leave{macro_depth_};
  // Defaults are evaluated at the call, in the macro's scope: they can read earlier parameters.
  const size_t first_default = n - def.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (vals[i]) {
      sc->vars[def.params[i]] = *vals[i];
    } else if (i >= first_default) {
      LRA_ASSIGN_OR_RETURN(Value d, eval(*def.defaults[i - first_default], sc));
      sc->vars[def.params[i]] = std::move(d);
    } else {
      sc->vars[def.params[i]] = Value::undefined(fmt::format("parameter '{}' was not provided", def.params[i]));
    }
  }
  std::string out;
  LRA_ASSIGN_OR_RETURN(Flow f, exec_list(def.body, sc, out));
  (void)f;
  return Value::string(std::move(out));
}

Result<Value> Interp::loop_attr(const Value& loop_value, const std::string& name) {
  const LoopObj& l = *loop_value.object_as<LoopObj>();
  const auto n = static_cast<int64_t>(l.items.size());
  const auto i = static_cast<int64_t>(l.index);
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem") return i > 0 ? l.items[i - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? l.items[i + 1] : Value::undefined("there is no next item");
  if (name == "cycle" || name == "changed") return bound_method(loop_value, name);
  return no_attribute(loop_value, name);
}

Result<Value> Interp::call_loop_method(const Callable& m, const CallArgs& args) {
  LoopObj& l = *m.self.object_as<LoopObj>();
  if (!args.kw.empty()) return render_error(fmt::format("TypeError: loop.{}() takes no keyword arguments", m.name));
  if (m.name == "cycle") {
    if (args.pos.empty()) return render_error("TypeError: no items for cycling given");
    return args.pos[l.index % args.pos.size()];
  }
  Value now = Value::tuple(args.pos);
  // Kept in the loop object: a namespace or loop in it could make a cycle.
  if (now.holds_ref()) return render_error("loop.changed() of a namespace or loop object is not supported");
  if (l.last_changed && equals(*l.last_changed, now)) return Value::boolean(false);
  l.last_changed = std::move(now);
  return Value::boolean(true);
}

}  // namespace lragent::server::jinja
