// The expression half of the template parser (jinja2's parser.py, parse_expression and below),
// shared with the statement parser (parser.cpp) through inheritance: the token cursor, the node
// builder that bounds nesting, and the bookkeeping of unknown filters and tests.
#pragma once

#include <string>
#include <vector>

#include "server/jinja/parser.h"

namespace lragent::server::jinja {

// How an error names a token ("'+'", "string", "end of template").
std::string describe_token(const Token& t);

class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

 protected:
  std::vector<Token> t_;
  size_t i_ = 0;
  int nesting_ = 0;
  // jinja2 reports an unknown filter or test when it compiles the template, except inside an if
  // statement or an inline if (its "soft frames", up to the next for, macro or block body): there
  // only when it is reached. Unknown names are collected, and soft_ says where they stand.
  struct Unknown {
    Token at;
    std::string what;
    bool soft;
  };
  std::vector<Unknown> unknown_;
  bool soft_ = false;

  // Sets soft_ for a body or an expression, as the frame jinja2 compiles it in.
  struct SoftScope {
    ExprParser* p;
    bool saved;
    SoftScope(ExprParser* parser, bool soft) : p(parser), saved(parser->soft_) { p->soft_ = soft; }
    ~SoftScope() { p->soft_ = saved; }
  };

  // Counts recursion into nested constructs; past kMaxParseNesting parsing fails.
  struct Nest {
    ExprParser* p;
    explicit Nest(ExprParser* parser) : p(parser) { ++p->nesting_; }
    ~Nest() { --p->nesting_; }
    bool too_deep() const { return p->nesting_ > kMaxParseNesting; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  Error fail(const std::string& what) const { return fail_at(cur(), what); }
  static Error fail_at(const Token& t, const std::string& what) {
    return make_error(ErrorCode::kCorrupt, "template syntax error at {}: {}", describe_position(t.line, t.column),
                      what);
  }
  Status expect_op(const char* op) {
    if (!skip_op(op)) return fail(fmt::format("expected token '{}', got {}", op, describe_token(cur())));
    return Status::Ok();
  }
  Status expect_type(TokenType type, const char* what) {
    if (cur().type != type) return fail(fmt::format("expected {}, got {}", what, describe_token(cur())));
    next();
    return Status::Ok();
  }
  Result<std::string> expect_name() {
    if (cur().type != TokenType::kName) return fail("expected a name, got " + describe_token(cur()));
    return next().text;
  }

  // Every expression node is made here, so that its height is checked as the tree grows.
  Result<ExprPtr> make(ExprKind kind, const Token& at, std::vector<ExprPtr> children = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    for (const auto& c : children)
      if (c) e->height = std::max(e->height, c->height + 1);
    e->children = std::move(children);
    if (e->height > kMaxExprHeight) return fail_at(at, "expression nested too deeply");
    return e;
  }
  Result<ExprPtr> make2(ExprKind kind, const Token& at, ExprPtr a, ExprPtr b = nullptr) {
    std::vector<ExprPtr> c;
    c.push_back(std::move(a));
    if (b) c.push_back(std::move(b));
    return make(kind, at, std::move(c));
  }
  void adopt_height(Expr& e, const ExprPtr& c) {
    if (c) e.height = std::max(e.height, c->height + 1);
  }
  // Whether the current token is one of the names that end a block ("endfor", "else", ...).
  bool at_end_tag(const std::vector<const char*>& ends) const {
    for (const char* e : ends)
      if (is_name(e)) return true;
    return false;
  }

  // ---- expressions ------------------------------------------------------------------------
  Result<Target> to_target(const Expr& e);
  Result<Target> parse_assign_target(bool with_namespace, const std::vector<const char*>& extra_end);
  Result<ExprPtr> parse_expression(bool with_condexpr);
  Result<ExprPtr> parse_or();
  Result<ExprPtr> parse_and();
  Result<ExprPtr> parse_not();
  Result<ExprPtr> parse_compare();
  Result<ExprPtr> binary(ExprPtr left, BinOp op, const Token& at, ExprPtr right);
  Result<ExprPtr> parse_math1();
  Result<ExprPtr> parse_concat();
  Result<ExprPtr> parse_math2();
  Result<ExprPtr> parse_pow();
  Result<ExprPtr> parse_unary(bool with_filter);
  Result<ExprPtr> parse_primary(bool with_namespace);
  bool is_tuple_end(const std::vector<const char*>& extra_end) const;
  Result<ExprPtr> parse_tuple(bool simplified, bool with_condexpr, const std::vector<const char*>& extra_end,
                              bool explicit_parens, bool with_namespace = false);
  Result<ExprPtr> parse_postfix(ExprPtr node);
  Result<ExprPtr> parse_filter_expr(ExprPtr node);
  Result<ExprPtr> parse_subscript(ExprPtr node);
  Result<ExprPtr> parse_subscribed();
  Status parse_call_args(Expr& e);
  Result<ExprPtr> parse_call(ExprPtr callee, ExprKind kind, std::string name);
  Result<std::string> dotted_name();
  Result<ExprPtr> parse_filter(ExprPtr node, bool start_inline);
  Result<ExprPtr> parse_test(ExprPtr node);
};

}  // namespace lragent::server::jinja
