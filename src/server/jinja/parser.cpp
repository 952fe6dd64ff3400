#include "server/jinja/parser.h"

#include <functional>

#include "server/jinja/expr_parser.h"

namespace lragent::server::jinja {

namespace {

// The statement half of the parser: template data, {{ }} and every {% %} tag.
class Parser : public ExprParser {
 public:
  using ExprParser::ExprParser;

  Result<StmtList> parse() {
    LRA_ASSIGN_OR_RETURN(StmtList body, subparse({}));
    if (cur().type != TokenType::kEof) return fail("unexpected " + describe_token(cur()));
    for (const Unknown& u : unknown_)
      if (!u.soft) return fail_at(u.at, u.what);
    return body;
  }

 private:
  int loop_depth_ = 0;  // for bodies around the current statement, up to the nearest macro

  // ---- statements -------------------------------------------------------------------------

  Result<StmtList> subparse(const std::vector<const char*>& ends) {
    Nest nest(this);
    if (nest.too_deep()) return fail("blocks nested too deeply");
    StmtList body;
    while (cur().type != TokenType::kEof) {
      const Token& tok = cur();
      if (tok.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kData;
        s->line = tok.line;
        s->column = tok.column;
        s->text = tok.text;
        body.push_back(std::move(s));
        next();
      } else if (tok.type == TokenType::kVariableBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = tok.line;
        s->column = tok.column;
        LRA_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, true, {}, false));
        LRA_RETURN_IF_ERROR(expect_type(TokenType::kVariableEnd, "end of print statement"));
        body.push_back(std::move(s));
      } else if (tok.type == TokenType::kBlockBegin) {
        next();
        if (!ends.empty() && at_end_tag(ends)) return body;
        LRA_ASSIGN_OR_RETURN(StmtPtr s, parse_statement());
        if (s) body.push_back(std::move(s));
        LRA_RETURN_IF_ERROR(expect_type(TokenType::kBlockEnd, "end of statement block"));
      } else {
        return fail("unexpected " + describe_token(tok));
      }
    }
    return body;
  }

  // A body up to one of `ends` (left as the current token, or consumed with drop_needle).
  Result<StmtList> parse_statements(const std::vector<const char*>& ends, bool drop_needle) {
    skip_op(":");
    LRA_RETURN_IF_ERROR(expect_type(TokenType::kBlockEnd, "end of statement block"));
    LRA_ASSIGN_OR_RETURN(StmtList body, subparse(ends));
    if (cur().type == TokenType::kEof) {
      std::string names;
      for (const char* e : ends) names += std::string(names.empty() ? "" : " or ") + "'" + e + "'";
      return fail("unexpected end of template, expected " + names);
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr new_stmt(StmtKind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  Result<StmtPtr> parse_statement() {
    const Token tok = cur();
    if (tok.type != TokenType::kName) return fail("tag name expected");
    const std::string& n = tok.text;
    if (n == "for") return parse_for();
    if (n == "if") return parse_if();
    if (n == "set") return parse_set();
    if (n == "macro" || n == "call") return parse_macro(n == "call");
    if (n == "filter") {
      next();
      auto s = new_stmt(StmtKind::kFilterBlock, tok);
      SoftScope inner(this, false);
      LRA_ASSIGN_OR_RETURN(s->filter, parse_filter(nullptr, true));
      LRA_ASSIGN_OR_RETURN(s->body, parse_statements({"endfilter"}, true));
      return s;
    }
    if (n == "with") return parse_with();
    if (n == "print") {
      next();
      auto s = new_stmt(StmtKind::kBody, tok);
      while (cur().type != TokenType::kBlockEnd) {
        if (!s->body.empty()) LRA_RETURN_IF_ERROR(expect_op(","));
        auto out = new_stmt(StmtKind::kOutput, cur());
        LRA_ASSIGN_OR_RETURN(out->expr, parse_expression(true));
        s->body.push_back(std::move(out));
      }
      return s;
    }
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) return fail(fmt::format("'{}' outside loop", n));
      next();
      return new_stmt(n == "break" ? StmtKind::kBreak : StmtKind::kContinue, tok);
    }
    if (n == "generation") {
      next();
      auto s = new_stmt(StmtKind::kBody, tok);
      SoftScope inner(this, false);  // transformers makes it a call block: the body is a macro
      LRA_ASSIGN_OR_RETURN(s->body, parse_statements({"endgeneration"}, true));
      return s;
    }
    for (const char* unsupported : {"block", "extends", "include", "import", "from", "autoescape"})
      if (n == unsupported) return fail(fmt::format("the '{}' tag is not supported (chat templates are one file)", n));
    return fail(fmt::format("encountered unknown tag '{}'", n));
  }

  Result<StmtPtr> parse_for() {
    auto s = new_stmt(StmtKind::kFor, next());
    LRA_ASSIGN_OR_RETURN(s->target, parse_assign_target(false, {"in"}));
    if (!skip_name("in")) return fail("expected 'in', got " + describe_token(cur()));
    LRA_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, false, {"recursive"}, false));
    SoftScope inner(this, false);  // the filter, the body and the else body are inner frames
    if (skip_name("if")) {
      LRA_ASSIGN_OR_RETURN(s->test, parse_expression(true));
    }
    if (is_name("recursive")) return fail("recursive loops are not supported");
    ++loop_depth_;
    auto body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (!body.ok()) return body.error();
    s->body = std::move(*body);
    if (next().text == "else") {
      LRA_ASSIGN_OR_RETURN(s->else_body, parse_statements({"endfor"}, true));
    }
    return s;
  }

  Result<StmtPtr> parse_if() {
    auto s = new_stmt(StmtKind::kIf, next());
    SoftScope soft(this, true);
    while (true) {
      LRA_ASSIGN_OR_RETURN(ExprPtr test, parse_tuple(false, false, {}, false));
      LRA_ASSIGN_OR_RETURN(StmtList body, parse_statements({"elif", "else", "endif"}, false));
      s->branches.emplace_back(std::move(test), std::move(body));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") {
        LRA_ASSIGN_OR_RETURN(s->else_body, parse_statements({"endif"}, true));
      }
      break;
    }
    return s;
  }

  Result<StmtPtr> parse_set() {
    const Token& tok = next();
    auto s = new_stmt(StmtKind::kSet, tok);
    LRA_ASSIGN_OR_RETURN(s->target, parse_assign_target(true, {}));
    if (skip_op("=")) {
      LRA_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, true, {}, false));
      return s;
    }
    s->kind = StmtKind::kSetBlock;
    SoftScope inner(this, false);
    LRA_ASSIGN_OR_RETURN(s->filter, parse_filter(nullptr, false));
    LRA_ASSIGN_OR_RETURN(s->body, parse_statements({"endset"}, true));
    return s;
  }

  Status parse_signature(Stmt& s) {
    LRA_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!s.params.empty()) LRA_RETURN_IF_ERROR(expect_op(","));
      LRA_ASSIGN_OR_RETURN(std::string param, expect_name());
      if (skip_op("=")) {
        LRA_ASSIGN_OR_RETURN(ExprPtr d, parse_expression(true));
        s.defaults.push_back(std::move(d));
      } else if (!s.defaults.empty()) {
        return fail("non-default argument follows default argument");
      }
      s.params.push_back(std::move(param));
    }
    return expect_op(")");
  }

  Result<StmtPtr> parse_macro(bool call_block) {
    auto s = new_stmt(call_block ? StmtKind::kCallBlock : StmtKind::kMacro, next());
    if (!call_block) {
      LRA_ASSIGN_OR_RETURN(s->name, expect_name());
      SoftScope inner(this, false);  // defaults are evaluated in the macro's frame
      LRA_RETURN_IF_ERROR(parse_signature(*s));
    } else {
      s->name = "caller";
      if (is_op("(")) LRA_RETURN_IF_ERROR(parse_signature(*s));
      const Token at = cur();
      LRA_ASSIGN_OR_RETURN(s->expr, parse_expression(true));
      if (s->expr->kind != ExprKind::kCall) return fail_at(at, "expected call");
    }
    const int saved = loop_depth_;
    loop_depth_ = 0;  // a macro's body is a function of its own: break cannot leave it
    SoftScope inner(this, false);
    auto body = parse_statements({call_block ? "endcall" : "endmacro"}, true);
    loop_depth_ = saved;
    if (!body.ok()) return body.error();
    s->body = std::move(*body);
    std::function<void(const Expr*)> scan_expr = [&](const Expr* e) {
      if (!e) return;
      if (e->kind == ExprKind::kName) {
        s->uses_varargs = s->uses_varargs || e->name == "varargs";
        s->uses_kwargs = s->uses_kwargs || e->name == "kwargs";
        s->uses_caller = s->uses_caller || e->name == "caller";
      }
      for (const auto& c : e->children) scan_expr(c.get());
      scan_expr(e->dyn_args.get());
      scan_expr(e->dyn_kwargs.get());
    };
    std::function<void(const StmtList&)> scan = [&](const StmtList& list) {
      for (const auto& st : list) {
        scan_expr(st->expr.get());
        scan_expr(st->test.get());
        scan_expr(st->filter.get());
        for (const auto& d : st->defaults) scan_expr(d.get());
        for (const auto& v : st->values) scan_expr(v.get());
        for (const auto& [t, b] : st->branches) {
          scan_expr(t.get());
          scan(b);
        }
        scan(st->body);
        scan(st->else_body);
      }
    };
    scan(s->body);
    return s;
  }

  Result<StmtPtr> parse_with() {
    auto s = new_stmt(StmtKind::kWith, next());
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->targets.empty()) LRA_RETURN_IF_ERROR(expect_op(","));
      LRA_ASSIGN_OR_RETURN(Target t, parse_assign_target(false, {}));
      LRA_RETURN_IF_ERROR(expect_op("="));
      LRA_ASSIGN_OR_RETURN(ExprPtr v, parse_expression(true));
      s->targets.push_back(std::move(t));
      s->values.push_back(std::move(v));
    }
    SoftScope inner(this, false);
    LRA_ASSIGN_OR_RETURN(s->body, parse_statements({"endwith"}, true));
    return s;
  }
};

}  // namespace

namespace {

void mark_constants(Expr* e) {
  if (!e) return;
  bool constant = true;
  for (const auto& c : e->children) {
    mark_constants(c.get());
    if (c && !c->constant) constant = false;
  }
  mark_constants(e->dyn_args.get());
  mark_constants(e->dyn_kwargs.get());
  switch (e->kind) {
    case ExprKind::kName:
    case ExprKind::kNsRef:
    case ExprKind::kCall: constant = false; break;
    case ExprKind::kFilter:
      constant = constant && e->children[0] && !e->dyn_args && !e->dyn_kwargs && e->name != "map" &&
                 e->name != "select" && e->name != "reject" && e->name != "selectattr" && e->name != "rejectattr";
      break;
    case ExprKind::kTest: constant = constant && !e->dyn_args && !e->dyn_kwargs; break;
    default: break;
  }
  e->constant = constant;
}

void mark_constants(const StmtList& list) {
  for (const auto& s : list) {
    mark_constants(s->expr.get());
    mark_constants(s->test.get());
    mark_constants(s->filter.get());
    for (const auto& d : s->defaults) mark_constants(d.get());
    for (const auto& v : s->values) mark_constants(v.get());
    for (const auto& [t, b] : s->branches) {
      mark_constants(t.get());
      mark_constants(b);
    }
    mark_constants(s->body);
    mark_constants(s->else_body);
  }
}

}  // namespace

Result<StmtList> parse_template(std::string_view source) {
  LRA_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  LRA_ASSIGN_OR_RETURN(StmtList program, Parser(std::move(tokens)).parse());
  mark_constants(program);
  return program;
}

}  // namespace lragent::server::jinja
