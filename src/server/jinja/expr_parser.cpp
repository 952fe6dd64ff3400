#include "server/jinja/expr_parser.h"

#include "server/jinja/builtins.h"

namespace lragent::server::jinja {

std::string describe_token(const Token& t) {
  switch (t.type) {
    case TokenType::kData: return "template data";
    case TokenType::kVariableBegin: return "begin of print statement";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kString: return "string";
    case TokenType::kInteger: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kEof: return "end of template";
    default: return "'" + t.text + "'";
  }
}

Result<Target> ExprParser::to_target(const Expr& e) {
  Target t;
  if (e.kind == ExprKind::kName) {
    t.kind = Target::Kind::kName;
    t.name = e.name;
  } else if (e.kind == ExprKind::kNsRef) {
    t.kind = Target::Kind::kNsAttr;
    t.name = e.name;
    t.attr = e.attr;
  } else if (e.kind == ExprKind::kTuple) {
    t.kind = Target::Kind::kTuple;
    for (const auto& c : e.children) {
      LRA_ASSIGN_OR_RETURN(Target item, to_target(*c));
      t.items.push_back(std::move(item));
    }
  } else {
    return make_error(ErrorCode::kCorrupt, "template syntax error at {}: can't assign to this expression",
                      describe_position(e.line, e.column));
  }
  return t;
}

Result<Target> ExprParser::parse_assign_target(bool with_namespace, const std::vector<const char*>& extra_end) {
  LRA_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(true, true, extra_end, false, with_namespace));
  return to_target(*e);
}

// ---- expressions ------------------------------------------------------------------------
Result<ExprPtr> ExprParser::parse_expression(bool with_condexpr) {
  Nest nest(this);
  if (nest.too_deep()) return fail("expression nested too deeply");
  if (!with_condexpr) return parse_or();
  const size_t first_unknown = unknown_.size();
  LRA_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
  while (is_name("if")) {
    // An inline if is a soft frame, the value before its "if" included.
    for (size_t i = first_unknown; i < unknown_.size(); ++i) unknown_[i].soft = true;
    SoftScope soft(this, true);
    const Token& at = next();
    LRA_ASSIGN_OR_RETURN(ExprPtr cond, parse_or());
    ExprPtr otherwise;
    if (skip_name("else")) {
      LRA_ASSIGN_OR_RETURN(otherwise, parse_expression(true));
    }
    std::vector<ExprPtr> c;
    c.push_back(std::move(expr));
    c.push_back(std::move(cond));
    c.push_back(std::move(otherwise));
    LRA_ASSIGN_OR_RETURN(expr, make(ExprKind::kCondExpr, at, std::move(c)));
  }
  return expr;
}

Result<ExprPtr> ExprParser::parse_or() {
  LRA_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
  while (is_name("or")) {
    const Token& at = next();
    LRA_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
    LRA_ASSIGN_OR_RETURN(left, make2(ExprKind::kOr, at, std::move(left), std::move(right)));
  }
  return left;
}

Result<ExprPtr> ExprParser::parse_and() {
  LRA_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
  while (is_name("and")) {
    const Token& at = next();
    LRA_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
    LRA_ASSIGN_OR_RETURN(left, make2(ExprKind::kAnd, at, std::move(left), std::move(right)));
  }
  return left;
}

Result<ExprPtr> ExprParser::parse_not() {
  if (is_name("not")) {
    Nest nest(this);
    if (nest.too_deep()) return fail("expression nested too deeply");
    const Token& at = next();
    LRA_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
    return make2(ExprKind::kNot, at, std::move(operand));
  }
  return parse_compare();
}

Result<ExprPtr> ExprParser::parse_compare() {
  const Token start = cur();
  LRA_ASSIGN_OR_RETURN(ExprPtr expr, parse_math1());
  std::vector<ExprPtr> operands;
  std::vector<CmpOp> ops;
  while (true) {
    static const std::pair<const char*, CmpOp> kOps[] = {{"==", CmpOp::kEq}, {"!=", CmpOp::kNe}, {"<", CmpOp::kLt},
                                                         {"<=", CmpOp::kLe}, {">", CmpOp::kGt},  {">=", CmpOp::kGe}};
    std::optional<CmpOp> op;
    for (const auto& [text, o] : kOps)
      if (is_op(text)) op = o;
    if (op) {
      next();
    } else if (is_name("in")) {
      next();
      op = CmpOp::kIn;
    } else if (is_name("not") && look().type == TokenType::kName && look().text == "in") {
      next();
      next();
      op = CmpOp::kNotIn;
    } else {
      break;
    }
    LRA_ASSIGN_OR_RETURN(ExprPtr rhs, parse_math1());
    ops.push_back(*op);
    operands.push_back(std::move(rhs));
  }
  if (ops.empty()) return expr;
  operands.insert(operands.begin(), std::move(expr));
  LRA_ASSIGN_OR_RETURN(ExprPtr cmp, make(ExprKind::kCompare, start, std::move(operands)));
  cmp->cmp_ops = std::move(ops);
  return cmp;
}

Result<ExprPtr> ExprParser::binary(ExprPtr left, BinOp op, const Token& at, ExprPtr right) {
  LRA_ASSIGN_OR_RETURN(ExprPtr e, make2(ExprKind::kBinary, at, std::move(left), std::move(right)));
  e->op = op;
  return e;
}

Result<ExprPtr> ExprParser::parse_math1() {
  LRA_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
  while (is_op("+") || is_op("-")) {
    const Token& at = next();
    const BinOp op = at.text == "+" ? BinOp::kAdd : BinOp::kSub;
    LRA_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
    LRA_ASSIGN_OR_RETURN(left, binary(std::move(left), op, at, std::move(right)));
  }
  return left;
}

Result<ExprPtr> ExprParser::parse_concat() {
  const Token start = cur();
  LRA_ASSIGN_OR_RETURN(ExprPtr first, parse_math2());
  if (!is_op("~")) return first;
  std::vector<ExprPtr> args;
  args.push_back(std::move(first));
  while (skip_op("~")) {
    LRA_ASSIGN_OR_RETURN(ExprPtr a, parse_math2());
    args.push_back(std::move(a));
  }
  return make(ExprKind::kConcat, start, std::move(args));
}

Result<ExprPtr> ExprParser::parse_math2() {
  LRA_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& at = next();
    const BinOp op = at.text == "*"    ? BinOp::kMul
                     : at.text == "/"  ? BinOp::kDiv
                     : at.text == "//" ? BinOp::kFloorDiv
                                       : BinOp::kMod;
    LRA_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
    LRA_ASSIGN_OR_RETURN(left, binary(std::move(left), op, at, std::move(right)));
  }
  return left;
}

Result<ExprPtr> ExprParser::parse_pow() {
  LRA_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
  while (is_op("**")) {
    const Token& at = next();
    LRA_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
    LRA_ASSIGN_OR_RETURN(left, binary(std::move(left), BinOp::kPow, at, std::move(right)));
  }
  return left;
}

Result<ExprPtr> ExprParser::parse_unary(bool with_filter) {
  Nest nest(this);
  if (nest.too_deep()) return fail("expression nested too deeply");
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const Token& at = next();
    const ExprKind kind = at.text == "-" ? ExprKind::kNeg : ExprKind::kPos;
    LRA_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
    LRA_ASSIGN_OR_RETURN(node, make2(kind, at, std::move(operand)));
  } else {
    LRA_ASSIGN_OR_RETURN(node, parse_primary(false));
  }
  LRA_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
  if (with_filter) {
    LRA_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
  }
  return node;
}

Result<ExprPtr> ExprParser::parse_primary(bool with_namespace) {
  Nest nest(this);
  if (nest.too_deep()) return fail("expression nested too deeply");
  const Token tok = cur();
  if (tok.type == TokenType::kName) {
    next();
    LRA_ASSIGN_OR_RETURN(ExprPtr e, make(ExprKind::kConst, tok));
    const std::string& n = tok.text;
    if (n == "true" || n == "True" || n == "false" || n == "False") {
      e->value = Value::boolean(n == "true" || n == "True");
    } else if (n == "none" || n == "None") {
      e->value = Value::none();
    } else if (with_namespace && is_op(".")) {
      next();
      e->kind = ExprKind::kNsRef;
      e->name = n;
      LRA_ASSIGN_OR_RETURN(e->attr, expect_name());
    } else {
      e->kind = ExprKind::kName;
      e->name = n;
    }
    return e;
  }
  if (tok.type == TokenType::kString) {
    std::string text;
    while (cur().type == TokenType::kString) text += next().text;
    LRA_ASSIGN_OR_RETURN(ExprPtr e, make(ExprKind::kConst, tok));
    e->value = Value::string(std::move(text));
    return e;
  }
  if (tok.type == TokenType::kInteger || tok.type == TokenType::kFloat) {
    next();
    LRA_ASSIGN_OR_RETURN(ExprPtr e, make(ExprKind::kConst, tok));
    e->value = tok.type == TokenType::kInteger ? Value::integer(tok.int_value) : Value::number(tok.float_value);
    return e;
  }
  if (is_op("(")) {
    next();
    LRA_ASSIGN_OR_RETURN(ExprPtr e, parse_tuple(false, true, {}, true));
    LRA_RETURN_IF_ERROR(expect_op(")"));
    return e;
  }
  if (is_op("[") || is_op("{")) {
    const bool dict = is_op("{");
    next();
    std::vector<ExprPtr> items;
    const char* close = dict ? "}" : "]";
    while (!is_op(close)) {
      if (!items.empty()) {
        LRA_RETURN_IF_ERROR(expect_op(","));
        if (is_op(close)) break;
      }
      LRA_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      items.push_back(std::move(item));
      if (dict) {
        LRA_RETURN_IF_ERROR(expect_op(":"));
        LRA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
        items.push_back(std::move(v));
      }
    }
    LRA_RETURN_IF_ERROR(expect_op(close));
    return make(dict ? ExprKind::kDict : ExprKind::kList, tok, std::move(items));
  }
  return fail("unexpected " + describe_token(tok));
}

bool ExprParser::is_tuple_end(const std::vector<const char*>& extra_end) const {
  if (cur().type == TokenType::kVariableEnd || cur().type == TokenType::kBlockEnd || is_op(")")) return true;
  return at_end_tag(extra_end);
}

// jinja2's parse_tuple: "a, b" is a tuple, "a" is a, "()" only inside explicit parentheses.
Result<ExprPtr> ExprParser::parse_tuple(bool simplified, bool with_condexpr, const std::vector<const char*>& extra_end,
                                        bool explicit_parens, bool with_namespace) {
  const Token start = cur();
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) LRA_RETURN_IF_ERROR(expect_op(","));
    if (is_tuple_end(extra_end)) break;
    if (simplified) {
      LRA_ASSIGN_OR_RETURN(ExprPtr e, parse_primary(with_namespace));
      args.push_back(std::move(e));
    } else {
      LRA_ASSIGN_OR_RETURN(ExprPtr e, parse_expression(with_condexpr));
      args.push_back(std::move(e));
    }
    if (!is_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parens) return fail("expected an expression, got " + describe_token(cur()));
  }
  return make(ExprKind::kTuple, start, std::move(args));
}

Result<ExprPtr> ExprParser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      LRA_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
    } else if (is_op("(")) {
      LRA_ASSIGN_OR_RETURN(node, parse_call(std::move(node), ExprKind::kCall, ""));
    } else {
      return node;
    }
  }
}

Result<ExprPtr> ExprParser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      LRA_ASSIGN_OR_RETURN(node, parse_filter(std::move(node), false));
    } else if (is_name("is")) {
      LRA_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
    } else if (is_op("(")) {
      LRA_ASSIGN_OR_RETURN(node, parse_call(std::move(node), ExprKind::kCall, ""));
    } else {
      return node;
    }
  }
}

Result<ExprPtr> ExprParser::parse_subscript(ExprPtr node) {
  const Token& at = next();
  if (at.text == ".") {
    const Token attr = next();
    if (attr.type == TokenType::kName) {
      LRA_ASSIGN_OR_RETURN(ExprPtr e, make2(ExprKind::kGetattr, at, std::move(node)));
      e->name = attr.text;
      return e;
    }
    if (attr.type != TokenType::kInteger) return fail_at(attr, "expected name or number");
    LRA_ASSIGN_OR_RETURN(ExprPtr index, make(ExprKind::kConst, attr));
    index->value = Value::integer(attr.int_value);
    return make2(ExprKind::kGetitem, at, std::move(node), std::move(index));
  }
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) LRA_RETURN_IF_ERROR(expect_op(","));
    LRA_ASSIGN_OR_RETURN(ExprPtr a, parse_subscribed());
    args.push_back(std::move(a));
  }
  LRA_RETURN_IF_ERROR(expect_op("]"));
  ExprPtr index;
  if (args.size() == 1)
    index = std::move(args[0]);
  else {
    LRA_ASSIGN_OR_RETURN(index, make(ExprKind::kTuple, at, std::move(args)));
  }
  return make2(ExprKind::kGetitem, at, std::move(node), std::move(index));
}

Result<ExprPtr> ExprParser::parse_subscribed() {
  const Token start = cur();
  std::vector<ExprPtr> parts;
  if (is_op(":")) {
    next();
    parts.push_back(nullptr);
  } else {
    LRA_ASSIGN_OR_RETURN(ExprPtr e, parse_expression(true));
    if (!is_op(":")) return e;
    next();
    parts.push_back(std::move(e));
  }
  auto bound = [&]() -> Result<ExprPtr> {
    if (is_op(":") || is_op("]") || is_op(",")) return ExprPtr();
    return parse_expression(true);
  };
  LRA_ASSIGN_OR_RETURN(ExprPtr stop, bound());
  parts.push_back(std::move(stop));
  ExprPtr step;
  if (skip_op(":")) {
    LRA_ASSIGN_OR_RETURN(step, bound());
  }
  parts.push_back(std::move(step));
  return make(ExprKind::kSlice, start, std::move(parts));
}

// ( args, name=kwargs, *dyn_args, **dyn_kwargs ) into e's children and fields.
Status ExprParser::parse_call_args(Expr& e) {
  const Token open = cur();
  LRA_RETURN_IF_ERROR(expect_op("("));
  bool require_comma = false;
  auto invalid = [&] { return fail_at(open, "invalid syntax for function call expression"); };
  while (!is_op(")")) {
    if (require_comma) {
      LRA_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
    }
    if (is_op("*")) {
      if (e.dyn_args || e.dyn_kwargs) return invalid();
      next();
      LRA_ASSIGN_OR_RETURN(e.dyn_args, parse_expression(true));
      adopt_height(e, e.dyn_args);
    } else if (is_op("**")) {
      if (e.dyn_kwargs) return invalid();
      next();
      LRA_ASSIGN_OR_RETURN(e.dyn_kwargs, parse_expression(true));
      adopt_height(e, e.dyn_kwargs);
    } else if (cur().type == TokenType::kName && look().type == TokenType::kOperator && look().text == "=") {
      if (e.dyn_kwargs) return invalid();
      std::string key = next().text;
      next();
      LRA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
      adopt_height(e, v);
      e.children.push_back(std::move(v));
      e.kw_names.push_back(std::move(key));
    } else {
      if (e.dyn_args || e.dyn_kwargs || !e.kw_names.empty()) return invalid();
      LRA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
      adopt_height(e, v);
      e.children.push_back(std::move(v));
    }
    require_comma = true;
  }
  if (e.height > kMaxExprHeight) return fail_at(open, "expression nested too deeply");
  return expect_op(")");
}

Result<ExprPtr> ExprParser::parse_call(ExprPtr callee, ExprKind kind, std::string name) {
  const Token at = cur();
  LRA_ASSIGN_OR_RETURN(ExprPtr e, make2(kind, at, std::move(callee)));
  if (!e->children[0]) e->children[0] = nullptr;
  e->name = std::move(name);
  LRA_RETURN_IF_ERROR(parse_call_args(*e));
  return e;
}

Result<std::string> ExprParser::dotted_name() {
  LRA_ASSIGN_OR_RETURN(std::string name, expect_name());
  while (skip_op(".")) {
    LRA_ASSIGN_OR_RETURN(std::string part, expect_name());
    name += "." + part;
  }
  return name;
}

Result<ExprPtr> ExprParser::parse_filter(ExprPtr node, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) next();
    start_inline = false;
    const Token at = cur();
    LRA_ASSIGN_OR_RETURN(std::string name, dotted_name());
    if (!is_filter_name(name)) unknown_.push_back({at, fmt::format("no filter named '{}'", name), soft_});
    std::vector<ExprPtr> c;
    c.push_back(std::move(node));
    LRA_ASSIGN_OR_RETURN(ExprPtr e, make(ExprKind::kFilter, at, std::move(c)));
    e->name = std::move(name);
    if (is_op("(")) LRA_RETURN_IF_ERROR(parse_call_args(*e));
    node = std::move(e);
  }
  return node;
}

Result<ExprPtr> ExprParser::parse_test(ExprPtr node) {
  const Token& at = next();
  const bool negated = skip_name("not");
  const Token name_tok = cur();
  LRA_ASSIGN_OR_RETURN(std::string name, dotted_name());
  if (!is_test_name(name)) unknown_.push_back({name_tok, fmt::format("no test named '{}'", name), soft_});
  LRA_ASSIGN_OR_RETURN(ExprPtr e, make2(ExprKind::kTest, at, std::move(node)));
  e->name = std::move(name);
  const TokenType ty = cur().type;
  if (is_op("(")) {
    LRA_RETURN_IF_ERROR(parse_call_args(*e));
  } else if ((ty == TokenType::kName || ty == TokenType::kString || ty == TokenType::kInteger ||
              ty == TokenType::kFloat || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) return fail("you cannot chain multiple tests with is");
    LRA_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary(false));
    LRA_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
    adopt_height(*e, arg);
    e->children.push_back(std::move(arg));
    if (e->height > kMaxExprHeight) return fail_at(at, "expression nested too deeply");
  }
  if (negated) return make2(ExprKind::kNot, at, std::move(e));
  return e;
}

}  // namespace lragent::server::jinja
