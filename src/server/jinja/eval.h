// The tree-walking evaluator behind Template::render: scopes as jinja2 resolves names (a for
// body and a macro call get their own, an if does not; macros see the scope they were defined in
// as it is when they run), loops with jinja2's `loop` object, macros with jinja2's argument
// rules, and every limit of RenderOptions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/jinja/builtins.h"
#include "server/jinja/jinja.h"
#include "server/jinja/parser.h"

namespace lragent::server::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

// A macro, a bound method (a str's, list's, dict's or loop's), a global function or a joiner.
struct Callable : Object {
  enum class Kind : uint8_t { kGlobal, kMethod, kMacro, kJoiner };
  Kind kind = Kind::kGlobal;
  std::string name;
  Value self;                    // kMethod: the object it is bound to
  const Stmt* macro = nullptr;   // kMacro: its definition (the template outlives every render)
  std::weak_ptr<Scope> closure;  // kMacro: where it was defined; weak, as that scope holds it
  bool joined = false;           // kJoiner: called before (then it gives its separator, in name)
  std::string repr() const override;
  bool holds_ref() const override { return self.holds_ref(); }
};

// jinja2's LoopContext for the current iteration of a for loop.
struct LoopObj : Object {
  std::vector<Value> items;
  size_t index = 0;
  std::optional<Value> last_changed;  // loop.changed()'s previous arguments
  std::string repr() const override;
};

class Interp {
 public:
  explicit Interp(const RenderOptions& options) : opt_(options) {}

  Result<std::string> render(const StmtList& program, const nlohmann::ordered_json& variables);

  // jinja2's sandboxed attribute (a.b) and item (a[b]) lookups: a missing one is undefined, a
  // lookup on undefined is an error, a mutating method is an undefined that fails when called.
  Result<Value> getattr(const Value& obj, const std::string& name);
  Result<Value> getitem(const Value& obj, const Value& key);
  Result<Value> call(const Value& callee, const CallArgs& args);

  // Counts `work` evaluation steps (builtins charge for work proportional to their input).
  Status charge(size_t work);
  // A string of `bytes` or a list of `items` the template builds must fit the limits.
  Status check_bytes(size_t bytes) const;
  Status check_items(size_t items) const;
  // A container the template built: nested within kMaxValueDepth.
  Status check_value(const Value& v) const;
  // str(v) within the output limit.
  Result<std::string> str(const Value& v) const;
  const RenderOptions& options() const { return opt_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using ScopePtr = std::shared_ptr<Scope>;

  const RenderOptions& opt_;
  int64_t steps_ = 0;
  int frames_ = 0;        // nested exec/eval calls (the evaluator's own recursion)
  uintptr_t stack_base_ = 0;  // the stack address render() started at
  int macro_depth_ = 0;   // nested macro calls
  bool folding_ = false;  // evaluating as jinja2's optimizer folds constants (see eval())

  struct Frame {
    Interp* in;
    explicit Frame(Interp* i) : in(i) { ++in->frames_; }
    ~Frame() { --in->frames_; }
  };
  // Whether the evaluator's recursion is past its bounds: kMaxFrames nested calls, or the stack
  // bytes they take (frames are several times larger under a sanitizer).
  bool too_deep() const;

  Result<Flow> exec_list(const StmtList& list, const ScopePtr& scope, std::string& out);
  Result<Flow> exec(const Stmt& s, const ScopePtr& scope, std::string& out);
  Result<Flow> exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  Result<Value> eval(const Expr& e, const ScopePtr& scope);
  Result<Value> eval_inner(const Expr& e, const ScopePtr& scope);
  Result<Value> eval_call(const Expr& e, const ScopePtr& scope, const Value* caller);
  Result<CallArgs> eval_args(const Expr& e, const ScopePtr& scope);
  Result<Value> eval_filter(const Expr& e, const ScopePtr& scope, const Value* input);
  Result<Value> eval_getitem(const Expr& e, const ScopePtr& scope);
  Status assign(const Target& t, const Value& v, Scope& scope);
  Result<Value> call_macro(const Callable& m, const CallArgs& args);
  Result<Value> loop_attr(const Value& loop, const std::string& name);
  Result<Value> call_loop_method(const Callable& m, const CallArgs& args);
  Status append_output(std::string& out, const Value& v) const;
  Status check_output(const std::string& out) const;
};

}  // namespace lragent::server::jinja
