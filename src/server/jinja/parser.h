// The syntax tree of a Jinja template and the parser that builds it from tokens, following jinja2's
// grammar (parser.py) statement by statement and operator by operator: the same precedence
// (filters and tests bind tighter than unary minus's operand, ** is left-associative), the same
// tuple rules ({{ a, b }} prints a tuple) and the same errors for what jinja2 rejects when it
// compiles (unknown filters and tests, break outside a loop).
//
// Nesting is bounded (kMaxParseNesting, kMaxExprHeight): every later walk over the tree recurses,
// so a template of ten thousand "(" or "+" is refused here instead of overflowing the stack there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "server/jinja/lexer.h"
#include "server/jinja/value.h"

namespace lragent::server::jinja {

constexpr int kMaxParseNesting = 100;  // brackets, unary operators and blocks inside each other
constexpr int kMaxExprHeight = 256;    // operators in one chain (a + b + c ...) and nesting together

enum class ExprKind : uint8_t {
  kConst,    // value
  kName,     // name
  kNsRef,    // name.attr as an assignment target ({% set ns.attr = ... %})
  kList,     // children: items
  kTuple,    // children: items
  kDict,     // children: key, value, key, value, ...
  kGetattr,  // children[0].name
  kGetitem,  // children[0][children[1]]
  kSlice,    // children: start, stop, step (each may be null); only as kGetitem's index
  kCall,     // children[0](args...): see Expr::args
  kFilter,   // children[0] | name(args...); children[0] is null in {% filter %} and {% set x | f %}
  kTest,     // children[0] is name(args...)
  kNot,      // children[0]
  kNeg,
  kPos,
  kBinary,  // children[0] op children[1]
  kAnd,
  kOr,
  kCompare,   // children[0] cmp_ops[0] children[1] cmp_ops[1] children[2] ...
  kConcat,    // children joined with ~
  kCondExpr,  // children: value if true, condition, value if false (null: undefined)
};

enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  int column = 0;
  int height = 1;  // 1 + the tallest child
  // jinja2's optimizer could fold it while compiling: literals and operators, filters and tests
  // over them (not names, calls, or filters that need the context: map, select, ...).
  bool constant = false;
  Value value;
  std::string name;
  std::string attr;  // kNsRef
  BinOp op = BinOp::kAdd;
  std::vector<CmpOp> cmp_ops;
  std::vector<ExprPtr> children;
  // kCall, kFilter, kTest: children[1..] are the arguments, the last kw_names.size() of them
  // given by keyword; then *dyn_args and **dyn_kwargs if written.
  std::vector<std::string> kw_names;
  ExprPtr dyn_args;
  ExprPtr dyn_kwargs;

  size_t positional_count() const { return children.size() - 1 - kw_names.size(); }
};

// An assignment target: a name, ns.attr, or a (nested) tuple of targets to unpack into.
struct Target {
  enum class Kind : uint8_t { kName, kNsAttr, kTuple };
  Kind kind = Kind::kName;
  std::string name;
  std::string attr;
  std::vector<Target> items;
};

enum class StmtKind : uint8_t {
  kData,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches, else_body
  kFor,          // for target in expr [if test]: body [else: else_body]
  kSet,          // target = expr
  kSetBlock,     // {% set target [| filter] %}body{% endset %}
  kMacro,        // name(params = defaults): body
  kCallBlock,    // {% call(params) expr %}body{% endcall %}: body is the `caller` macro
  kFilterBlock,  // {% filter f %}body{% endfilter %}
  kWith,         // targets = values: body, in a new scope
  kBreak,
  kContinue,
  kBody,  // {% generation %}body{% endgeneration %}: the body, as transformers renders it
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind = StmtKind::kData;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr test;
  ExprPtr filter;
  Target target;
  StmtList body;
  StmtList else_body;
  std::vector<std::pair<ExprPtr, StmtList>> branches;
  // kMacro / kCallBlock: the signature; whether the body reads varargs, kwargs or caller (a
  // macro takes extra arguments only then, as jinja2's do).
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
  // kWith
  std::vector<Target> targets;
  std::vector<ExprPtr> values;
};

// The statements of a whole template. Errors are kCorrupt and name the line and column.
Result<StmtList> parse_template(std::string_view source);

}  // namespace lragent::server::jinja
