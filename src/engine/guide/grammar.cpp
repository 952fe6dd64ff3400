// GBNF text -> rules of byte-range sequences (a recursive-descent parser that lowers groups,
// repetitions and classes to helper rules as it goes, as llama.cpp's grammar parser does) ->
// checks that the grammar can be served exactly (grammar.h) -> the flat element array.
#include "engine/guide/grammar.h"

#include <algorithm>
#include <cctype>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "engine/guide/utf8_ranges.h"

namespace lragent::guide {
namespace {

// One symbol of an alternative: a byte in [lo, hi], or (rule >= 0) a rule.
struct Sym {
  int32_t rule = -1;
  uint8_t lo = 0, hi = 0;
};
using Alt = std::vector<Sym>;

Sym byte_sym(uint8_t lo, uint8_t hi) { return Sym{-1, lo, hi}; }
Sym rule_sym(int32_t r) { return Sym{r, 0, 0}; }

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view text) : t_(text) {}

  Result<std::unique_ptr<Grammar>> build(std::string_view root) {
    LRA_RETURN_IF_ERROR(parse_rules());
    for (const Rule& r : rules_)
      if (!r.defined)
        return bad(r.used_at, fmt::format("rule '{}' is used but never defined", r.name));
    const auto it = by_name_.find(std::string(root));
    if (it == by_name_.end())
      return make_error(ErrorCode::kInvalidArgument, "grammar: there is no rule named '{}' to start from: define one ({} ::= ...)",
                        root, root);
    LRA_RETURN_IF_ERROR(check(it->second));
    return flatten(it->second);
  }

 private:
  struct Rule {
    std::string name;
    std::vector<Alt> alts;
    bool defined = false;
    bool helper = false;    // made for a group, repetition or class (named after its rule, "root-2")
    size_t used_at = 0;     // where it was first referred to (or made)
    size_t defined_at = 0;  // where its definition starts
  };

  std::string_view t_;
  size_t pos_ = 0;
  int depth_ = 0;
  size_t symbols_ = 0;  // every symbol made so far, against Grammar::kMaxElements
  std::vector<Rule> rules_;
  std::unordered_map<std::string, int32_t> by_name_;
  std::string current_;  // the rule being defined, to name its helpers
  int helpers_ = 0;      // helpers made for current_

  // --- errors -------------------------------------------------------------------------------
  std::pair<size_t, size_t> line_col(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return {line, col};
  }
  Error fail(ErrorCode code, size_t at, std::string_view what) const {
    const auto [line, col] = line_col(at);
    return make_error(code, "grammar: {} (line {}, column {})", what, line, col);
  }
  Error bad(size_t at, std::string_view what) const { return fail(ErrorCode::kInvalidArgument, at, what); }

  // --- rules ----------------------------------------------------------------------------------
  int32_t rule_id(const std::string& name, size_t at) {
    const auto [it, added] = by_name_.emplace(name, static_cast<int32_t>(rules_.size()));
    if (added) {
      rules_.push_back(Rule{});
      rules_.back().name = name;
      rules_.back().used_at = at;
    }
    return it->second;
  }
  int32_t helper(std::vector<Alt> alts, size_t at) {
    Rule r;
    r.name = fmt::format("{}-{}", current_, ++helpers_);
    r.alts = std::move(alts);
    r.defined = r.helper = true;
    r.used_at = r.defined_at = at;
    rules_.push_back(std::move(r));
    return static_cast<int32_t>(rules_.size() - 1);
  }
  Status count(size_t n, size_t at) {
    symbols_ += n;
    if (symbols_ > Grammar::kMaxElements)
      return bad(at, fmt::format("too large: more than {} symbols once groups and repetitions are spelled out "
                                 "(lower the repetition counts)",
                                 Grammar::kMaxElements));
    return Status::Ok();
  }

  // --- lexing ---------------------------------------------------------------------------------
  bool at_end() const { return pos_ >= t_.size(); }
  char peek() const { return at_end() ? '\0' : t_[pos_]; }
  void skip_space() {
    while (!at_end()) {
      const char c = t_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && t_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  size_t name_end(size_t p) const {
    while (p < t_.size() && is_name_char(t_[p])) ++p;
    return p;
  }
  // A name followed by `::=` starts the next rule: that is where a rule ends.
  bool rule_starts_here() {
    const size_t save = pos_;
    pos_ = name_end(pos_);
    skip_space();
    const bool yes = t_.substr(pos_, 3) == "::=";
    pos_ = save;
    return yes;
  }

  // One character of a literal or class, escapes decoded, as a code point.
  Result<uint32_t> parse_char(std::string_view where) {
    const size_t at = pos_;
    if (at_end()) return bad(at, fmt::format("the text ends inside {}", where));
    if (t_[pos_] != '\\') {
      uint32_t cp = 0;
      const int n = utf8_char(t_, pos_, &cp);
      if (n == 0) return bad(at, "invalid UTF-8");
      pos_ += static_cast<size_t>(n);
      return cp;
    }
    if (++pos_ >= t_.size()) return bad(at, fmt::format("the text ends inside {}", where));
    const char e = t_[pos_++];
    auto hex = [&](int digits) -> Result<uint32_t> {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i, ++pos_) {
        if (at_end() || !is_hex(t_[pos_]))
          return bad(at, fmt::format("bad escape: \\{} wants {} hex digits", e, digits));
        v = v * 16 + hex_value(t_[pos_]);
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
        return bad(at, fmt::format("bad escape: U+{:X} is not a character", v));
      return v;
    };
    switch (e) {
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case 'f': return uint32_t{'\f'};
      case 'v': return uint32_t{'\v'};
      case '0': return uint32_t{0};
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default:
        if (e > ' ' && e < 0x7F && !(std::isalnum(static_cast<unsigned char>(e)) != 0))
          return static_cast<uint32_t>(e);  // \" \\ \[ \] \- ...
        return bad(at, fmt::format("unknown escape '\\{}' (the escapes are \\n \\r \\t \\f \\v \\0 \\xHH \\uHHHH "
                                   "\\UHHHHHHHH and \\ before punctuation)",
                                   e));
    }
  }

  // --- items ----------------------------------------------------------------------------------
  // The symbols of a class: one byte range, or a helper rule of UTF-8 byte-range sequences.
  Result<Alt> class_syms(const Ranges& set, size_t at) {
    const std::vector<Seq> seqs = class_seqs(set);
    if (seqs.size() == 1 && seqs[0].n == 1) {
      LRA_RETURN_IF_ERROR(count(1, at));
      return Alt{byte_sym(seqs[0].lo[0], seqs[0].hi[0])};
    }
    std::vector<Alt> alts;
    for (const Seq& s : seqs) {
      Alt a;
      for (int i = 0; i < s.n; ++i) a.push_back(byte_sym(s.lo[i], s.hi[i]));
      LRA_RETURN_IF_ERROR(count(a.size(), at));
      alts.push_back(std::move(a));
    }
    return Alt{rule_sym(helper(std::move(alts), at))};  // no alternatives: a class matching nothing
  }

  Result<Alt> parse_literal() {
    const size_t at = pos_++;
    Alt out;
    while (true) {
      if (at_end()) return bad(at, "unterminated string literal: it has no closing '\"'");
      if (t_[pos_] == '"') break;
      LRA_ASSIGN_OR_RETURN(uint32_t cp, parse_char("a string literal"));
      uint8_t b[4];
      const int n = utf8_encode(cp, b);
      for (int i = 0; i < n; ++i) out.push_back(byte_sym(b[i], b[i]));
    }
    ++pos_;
    LRA_RETURN_IF_ERROR(count(out.size(), at));
    return out;
  }

  Result<Alt> parse_class() {
    const size_t at = pos_++;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    Ranges set;
    while (true) {
      if (at_end()) return bad(at, "unterminated character class: it has no closing ']'");
      if (t_[pos_] == ']') break;
      const size_t item = pos_;
      LRA_ASSIGN_OR_RETURN(uint32_t lo, parse_char("a character class"));
      uint32_t hi = lo;
      if (pos_ + 1 < t_.size() && t_[pos_] == '-' && t_[pos_ + 1] != ']') {
        ++pos_;
        LRA_ASSIGN_OR_RETURN(hi, parse_char("a character class"));
        if (hi < lo) return bad(item, "character range out of order (its end comes before its start)");
      }
      set.emplace_back(lo, hi);
    }
    ++pos_;
    return class_syms(negated ? negate(set) : set, at);
  }

  Result<Alt> parse_item() {
    const size_t at = pos_;
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return class_syms({{0, kMaxCodePoint}}, at);
    }
    if (c == '(') {
      if (++depth_ > Grammar::kMaxDepth)
        return bad(at, fmt::format("groups nested deeper than {}", Grammar::kMaxDepth));
      ++pos_;
      LRA_ASSIGN_OR_RETURN(std::vector<Alt> alts, parse_alternates());
      skip_space();
      if (peek() != ')') return bad(at, "unbalanced parenthesis: this '(' is never closed");
      ++pos_;
      --depth_;
      LRA_RETURN_IF_ERROR(count(1, at));
      return Alt{rule_sym(helper(std::move(alts), at))};
    }
    if (is_name_char(c)) {
      const size_t end = name_end(pos_);
      const std::string name(t_.substr(pos_, end - pos_));
      pos_ = end;
      LRA_RETURN_IF_ERROR(count(1, at));
      return Alt{rule_sym(rule_id(name, at))};
    }
    if (c == '<' || c == '!')
      return fail(ErrorCode::kUnsupported, at, "token references (<[id]>, <|token|>, !) are not supported");
    if (c == ')') return bad(at, "unbalanced parenthesis: ')' without '('");
    return bad(at, fmt::format("unexpected '{}' (an item is a \"literal\", a [class], '.', a rule name or a "
                               "(group))",
                               std::string(1, c)));
  }

  // x{m}, x{m,}, x{m,n}: the counts after '{'.
  Result<std::pair<int, int>> parse_counts(size_t at) {
    auto number = [&]() -> Result<int> {
      skip_space();
      if (at_end() || t_[pos_] < '0' || t_[pos_] > '9') return bad(at, "a repetition {m,n} wants numbers");
      int v = 0;
      while (!at_end() && t_[pos_] >= '0' && t_[pos_] <= '9') {
        v = std::min(v * 10 + (t_[pos_] - '0'), Grammar::kMaxRepeat + 1);
        ++pos_;
      }
      if (v > Grammar::kMaxRepeat)
        return bad(at, fmt::format("repetition count above {}", Grammar::kMaxRepeat));
      return v;
    };
    LRA_ASSIGN_OR_RETURN(int lo, number());
    int hi = lo;
    skip_space();
    if (peek() == ',') {
      ++pos_;
      skip_space();
      if (peek() == '}') {
        hi = -1;
      } else {
        LRA_ASSIGN_OR_RETURN(hi, number());
        if (hi < lo) return bad(at, "repetition {m,n} with n < m");
      }
    }
    skip_space();
    if (peek() != '}') return bad(at, "unterminated repetition: it has no closing '}'");
    ++pos_;
    return std::pair{lo, hi};
  }

  // `item` repeated lo..hi times (hi -1: unbounded), appended to `seq`.
  Status repeat(Alt& seq, Alt item, int lo, int hi, size_t at) {
    if (item.empty()) return Status::Ok();  // ""* is ""
    Sym x = item[0];
    if (item.size() > 1) x = rule_sym(helper({std::move(item)}, at));
    LRA_RETURN_IF_ERROR(count(static_cast<size_t>(lo) + 3, at));
    seq.insert(seq.end(), static_cast<size_t>(lo), x);
    if (hi < 0) {  // x*: star ::= x star |
      const int32_t star = helper({}, at);
      rules_[static_cast<size_t>(star)].alts = {Alt{x, rule_sym(star)}, Alt{}};
      seq.push_back(rule_sym(star));
      return Status::Ok();
    }
    // hi - lo optional copies, nested so that each may stop: opt_k ::= x opt_(k-1) |
    int32_t opt = -1;
    for (int k = 0; k < hi - lo; ++k) {
      LRA_RETURN_IF_ERROR(count(2, at));
      Alt more{x};
      if (opt >= 0) more.push_back(rule_sym(opt));
      opt = helper({std::move(more), Alt{}}, at);
    }
    if (opt >= 0) seq.push_back(rule_sym(opt));
    return Status::Ok();
  }

  Result<Alt> parse_sequence() {
    Alt seq;
    while (true) {
      skip_space();
      const char c = peek();
      if (at_end() || c == '|' || c == ')') break;
      if (is_name_char(c) && rule_starts_here()) break;
      const size_t at = pos_;
      LRA_ASSIGN_OR_RETURN(Alt item, parse_item());
      // Postfix operators apply to the item they follow (x*?, x+{2} repeat the repetition).
      while (true) {
        skip_space();
        const char op = peek();
        int lo = 0, hi = 0;
        if (op == '*') lo = 0, hi = -1;
        else if (op == '+') lo = 1, hi = -1;
        else if (op == '?') lo = 0, hi = 1;
        else if (op != '{') break;
        ++pos_;
        if (op == '{') {
          LRA_ASSIGN_OR_RETURN(std::tie(lo, hi), parse_counts(at));
        }
        Alt repeated;
        LRA_RETURN_IF_ERROR(repeat(repeated, std::move(item), lo, hi, at));
        item = std::move(repeated);
      }
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  Result<std::vector<Alt>> parse_alternates() {
    std::vector<Alt> alts;
    while (true) {
      LRA_ASSIGN_OR_RETURN(Alt seq, parse_sequence());
      alts.push_back(std::move(seq));
      skip_space();
      if (peek() != '|') break;
      ++pos_;
    }
    return alts;
  }

  Status parse_rules() {
    skip_space();
    if (at_end()) return make_error(ErrorCode::kInvalidArgument, "grammar: the text has no rules (want `root ::= ...`)");
    while (!at_end()) {
      const size_t at = pos_;
      const size_t end = name_end(pos_);
      if (end == pos_) return bad(at, "expected a rule name (letters, digits, '-', '_') followed by '::='");
      const std::string name(t_.substr(pos_, end - pos_));
      pos_ = end;
      skip_space();
      if (t_.substr(pos_, 3) != "::=") return bad(pos_, fmt::format("expected '::=' after the rule name '{}'", name));
      pos_ += 3;
      const int32_t id = rule_id(name, at);
      if (rules_[static_cast<size_t>(id)].defined) {
        const auto [line, col] = line_col(rules_[static_cast<size_t>(id)].defined_at);
        return bad(at, fmt::format("rule '{}' is defined twice (first at line {}, column {})", name, line, col));
      }
      rules_[static_cast<size_t>(id)].defined = true;
      rules_[static_cast<size_t>(id)].defined_at = at;
      current_ = name;
      helpers_ = 0;
      LRA_ASSIGN_OR_RETURN(std::vector<Alt> alts, parse_alternates());
      rules_[static_cast<size_t>(id)].alts = std::move(alts);
      skip_space();
      if (peek() == ')') return bad(pos_, "unbalanced parenthesis: ')' without '('");
    }
    return Status::Ok();
  }

  // --- checks ---------------------------------------------------------------------------------
  std::string describe(int32_t r) const {
    const Rule& rule = rules_[static_cast<size_t>(r)];
    if (!rule.helper) return fmt::format("rule '{}'", rule.name);
    const auto [line, col] = line_col(rule.used_at);
    return fmt::format("rule '{}' (a group, repetition or class at line {}, column {})", rule.name, line, col);
  }

  Status check(int32_t root) {
    const size_t n = rules_.size();
    // Reachable from the start rule.
    std::vector<uint8_t> reach(n, 0);
    std::vector<int32_t> todo{root};
    reach[static_cast<size_t>(root)] = 1;
    while (!todo.empty()) {
      const int32_t r = todo.back();
      todo.pop_back();
      for (const Alt& a : rules_[static_cast<size_t>(r)].alts)
        for (const Sym& s : a)
          if (s.rule >= 0 && !reach[static_cast<size_t>(s.rule)]) {
            reach[static_cast<size_t>(s.rule)] = 1;
            todo.push_back(s.rule);
          }
    }
    // Productive (can derive a finite text) and nullable (can derive the empty text): fixpoints.
    std::vector<uint8_t> productive(n, 0), nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        for (const Alt& a : rules_[r].alts) {
          bool prod = true, null = true;
          for (const Sym& s : a) {
            if (s.rule < 0) {
              null = false;
            } else {
              prod = prod && productive[static_cast<size_t>(s.rule)];
              null = null && nullable[static_cast<size_t>(s.rule)];
            }
          }
          if (prod && !productive[r]) productive[r] = 1, changed = true;
          if (null && !nullable[r]) nullable[r] = 1, changed = true;
        }
      }
    }
    for (size_t r = 0; r < n; ++r)
      if (reach[r] && !productive[r])
        return bad(rules_[r].helper ? rules_[r].used_at : rules_[r].defined_at,
                   fmt::format("{} can never finish: each of its alternatives needs itself again or a character "
                               "class that matches nothing, so no text could complete it",
                               describe(static_cast<int32_t>(r))));
    // Left corners: B is a left corner of A when an alternative of A reaches B before any byte.
    // Only one not in the alternative's last place grows the parse stack; a cycle through one
    // would grow it forever.
    struct Edge {
      int32_t to;
      bool tail;
    };
    std::vector<std::vector<Edge>> edges(n);
    for (size_t r = 0; r < n; ++r) {
      if (!reach[r]) continue;
      for (const Alt& a : rules_[r].alts)
        for (size_t i = 0; i < a.size() && a[i].rule >= 0; ++i) {
          edges[r].push_back(Edge{a[i].rule, i + 1 == a.size()});
          if (!nullable[static_cast<size_t>(a[i].rule)]) break;
        }
    }
    const std::vector<int32_t> comp = components(edges);
    for (size_t r = 0; r < n; ++r)
      for (const Edge& e : edges[r])
        if (!e.tail && comp[r] == comp[static_cast<size_t>(e.to)])
          return bad(rules_[r].helper ? rules_[r].used_at : rules_[r].defined_at,
                     fmt::format("{} is left-recursive: it comes back to itself through {} before reading any "
                                 "text; write it with repetition instead (list ::= item (\",\" item)*)",
                                 describe(static_cast<int32_t>(r)), describe(e.to)));
    return Status::Ok();
  }

  // Strongly connected components (Tarjan's, iterative: helper rules can nest deep).
  template <typename E>
  static std::vector<int32_t> components(const std::vector<std::vector<E>>& edges) {
    const size_t n = edges.size();
    std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1);
    std::vector<uint8_t> on_stack(n, 0);
    std::vector<int32_t> stack;
    std::vector<std::pair<int32_t, size_t>> call;  // (node, next edge)
    int32_t next_index = 0, next_comp = 0;
    for (size_t s = 0; s < n; ++s) {
      if (index[s] >= 0) continue;
      call.emplace_back(static_cast<int32_t>(s), 0);
      while (!call.empty()) {
        auto& [v, e] = call.back();
        const auto vi = static_cast<size_t>(v);
        if (e == 0 && index[vi] < 0) {
          index[vi] = low[vi] = next_index++;
          stack.push_back(v);
          on_stack[vi] = 1;
        }
        if (e < edges[vi].size()) {
          const auto w = static_cast<size_t>(edges[vi][e++].to);
          if (index[w] < 0) {
            call.emplace_back(static_cast<int32_t>(w), 0);
          } else if (on_stack[w]) {
            low[vi] = std::min(low[vi], index[w]);
          }
          continue;
        }
        if (low[vi] == index[vi]) {
          int32_t w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[static_cast<size_t>(w)] = 0;
            comp[static_cast<size_t>(w)] = next_comp;
          } while (w != v);
          ++next_comp;
        }
        const int32_t done = v;
        call.pop_back();
        if (!call.empty()) {
          const auto p = static_cast<size_t>(call.back().first);
          low[p] = std::min(low[p], low[static_cast<size_t>(done)]);
        }
      }
    }
    return comp;
  }

  std::unique_ptr<Grammar> flatten(int32_t root) {
    auto g = std::unique_ptr<Grammar>(new Grammar());
    g->alt_begin_.push_back(0);
    for (Rule& r : rules_) {
      for (const Alt& a : r.alts) {
        g->alt_start_.push_back(static_cast<int32_t>(g->elements_.size()));
        for (const Sym& s : a) {
          Grammar::Element e;
          if (s.rule >= 0) {
            e.kind = Grammar::Element::kRule;
            e.rule = s.rule;
          } else {
            e.kind = Grammar::Element::kBytes;
            e.lo = s.lo;
            e.hi = s.hi;
          }
          g->elements_.push_back(e);
        }
        g->elements_.push_back(Grammar::Element{});  // kEnd
      }
      g->alt_begin_.push_back(static_cast<uint32_t>(g->alt_start_.size()));
      g->names_.push_back(std::move(r.name));
    }
    g->root_ = root;
    return g;
  }
};

Result<std::unique_ptr<Grammar>> Grammar::parse(std::string_view text, std::string_view root) {
  return GrammarBuilder(text).build(root);
}

std::string grammar_after_reasoning(std::string_view gbnf, std::string_view root, std::string* new_root) {
  // Rule names the grammar does not use (a name containing "lragent-think" is unlikely, but
  // then a number makes them new).
  std::string p = "lragent-think";
  for (int k = 2; gbnf.find(p) != std::string_view::npos; ++k) p = fmt::format("lragent-think{}", k);
  // Text without "</think>", as reasoning.cpp's after_reasoning spells it for regexes: after a
  // '<', a run of the tag's prefix breaks off at a character that is neither its next one nor
  // '<', meets another '<', or the text ends inside it.
  std::string text = fmt::format(
      "{gbnf}\n"
      "{p} ::= \"<think>\"? {p}-text \"</think>\" [ \\t\\n\\r\\f\\v]* {root}\n"
      "{p}-text ::= ([^<] | \"<\" ({p}-prefix \"<\")* {p}-break)* (\"<\" ({p}-prefix \"<\")* {p}-prefix)?\n"
      "{p}-prefix ::= (\"/\" (\"t\" (\"h\" (\"i\" (\"n\" \"k\"?)?)?)?)?)?\n"
      "{p}-break ::= [^/<] | \"/\" ([^t<] | \"t\" ([^h<] | \"h\" ([^i<] | \"i\" ([^n<] | \"n\" ([^k<] | \"k\" "
      "[^<>])))))\n",
      fmt::arg("gbnf", gbnf), fmt::arg("p", p), fmt::arg("root", root));
  *new_root = p;  // last: the caller may pass its own root as both `root` and `new_root`
  return text;
}

}  // namespace lragent::guide
