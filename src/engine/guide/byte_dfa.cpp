// Pattern -> Thompson NFA over bytes (a recursive-descent parser building fragments directly)
// -> DFA by subset construction on demand. Character classes are sets of code points turned
// into alternatives of UTF-8 byte-range sequences (the utf8-ranges construction of RE2 and
// Rust's regex-syntax), so the automaton never sees anything but bytes.
#include "engine/guide/byte_dfa.h"
#include "engine/guide/utf8_ranges.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <limits>
#include <optional>
#include <string>
#include <utility>

namespace lragent::guide {
namespace {

using detail::NfaState;
// Groups recurse in the parser; a cap keeps a pattern of 100k '(' from exhausting the stack.
constexpr int kMaxDepth = 500;

bool consumes(const NfaState& s) { return s.lo <= s.hi; }

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_punct(char c) { return c > ' ' && c < 0x7F && !is_alpha(c) && !is_digit(c); }

// A fragment of the NFA under construction. Its states are the contiguous block
// [begin, nfa.size()) while it is the newest one, and no edge leaves the block: that is what
// lets a repetition copy it by shifting indices.
struct Frag {
  int32_t begin = 0;
  int32_t start = 0;
  int32_t end = 0;  // the state whose `out` (still -1) is linked to what follows
};

struct Quant {
  int min = 0, max = 0;  // max -1: unbounded
};

// A parsed escape or class member: one code point, or a set (\d, \W, ...).
struct Atom {
  bool is_set = false;
  uint32_t cp = 0;
  Ranges set;
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Result<Frag> parse() {
    if (!p_.empty() && p_[0] == '^') pos_ = 1;  // whole-string matching makes it a no-op
    LRA_ASSIGN_OR_RETURN(Frag f, parse_alt(0));
    // parse_alt stops only at the end or at a ')' that no group of ours opened.
    if (pos_ < p_.size()) return bad(pos_, "unbalanced parenthesis: ')' without '('");
    // parse_piece checks the size after each piece; this catches states no piece made (||||...).
    if (nfa.size() > ByteDfa::kMaxNfaStates) return too_big(pos_);
    return f;
  }

  std::vector<NfaState> nfa;  // [n_nfa]

 private:
  static Error fail(ErrorCode code, size_t at, std::string_view what) {
    return make_error(code, "regex pattern: {} (at byte {})", what, at);
  }
  static Error bad(size_t at, std::string_view what) { return fail(ErrorCode::kInvalidArgument, at, what); }
  static Error unsupported(size_t at, std::string_view what) { return fail(ErrorCode::kUnsupported, at, what); }
  Error too_big(size_t at) const {
    return make_error(ErrorCode::kInvalidArgument,
                      "regex pattern: too large, its automaton would exceed {} NFA states (at byte {}: "
                      "reduce the repetition counts or their nesting)",
                      ByteDfa::kMaxNfaStates, at);
  }

  int32_t add(NfaState s) {
    nfa.push_back(s);
    return static_cast<int32_t>(nfa.size() - 1);
  }
  int32_t add_split(int32_t a, int32_t b) { return add(NfaState{a, b, 1, 0}); }
  void link(int32_t end, int32_t to) {
    assert(nfa[end].out < 0 && "a fragment's end is linked once");
    nfa[end].out = to;
  }
  Frag empty() {
    const int32_t e = add({});
    return {e, e, e};
  }

  // Alternatives of byte-range sequences sharing one end state.
  Frag seqs_frag(const std::vector<Seq>& seqs) {
    const int32_t begin = static_cast<int32_t>(nfa.size());
    if (seqs.size() == 1 && seqs[0].n == 1) {
      const int32_t s = add(NfaState{-1, -1, seqs[0].lo[0], seqs[0].hi[0]});
      return {begin, s, s};
    }
    const int32_t end = add({});
    std::vector<int32_t> starts;
    for (const Seq& q : seqs) {
      int32_t prev = -1;
      for (int i = 0; i < q.n; ++i) {
        const int32_t s = add(NfaState{-1, -1, q.lo[i], q.hi[i]});
        if (prev < 0) starts.push_back(s);
        else link(prev, s);
        prev = s;
      }
      link(prev, end);
    }
    // An empty class (e.g. [^\s\S]) starts at a state with no edges: it matches nothing.
    int32_t start = starts.empty() ? add(NfaState{-1, -1, 1, 0}) : starts.back();
    for (size_t i = starts.size(); i-- > 1;) start = add_split(starts[i - 1], start);
    return {begin, start, end};
  }
  Frag class_frag(const Ranges& set) {
    return seqs_frag(class_seqs(set));
  }
  Frag bytes_frag(const uint8_t* bytes, int n) {
    const int32_t begin = static_cast<int32_t>(nfa.size());
    for (int i = 0; i < n; ++i) {
      add(NfaState{-1, -1, bytes[i], bytes[i]});
      if (i > 0) link(begin + i - 1, begin + i);
    }
    return {begin, begin, begin + n - 1};
  }
  Frag cp_frag(uint32_t cp) {
    uint8_t b[4];
    return bytes_frag(b, utf8_encode(cp, b));
  }

  // Copies the newest fragment f (size states) after it.
  Frag clone(const Frag& f, size_t size) {
    const int32_t shift = static_cast<int32_t>(nfa.size()) - f.begin;
    for (size_t i = 0; i < size; ++i) {
      NfaState s = nfa[f.begin + i];  // by value: add() may reallocate
      if (s.out >= 0) s.out += shift;
      if (s.out2 >= 0) s.out2 += shift;
      add(s);
    }
    return {f.begin + shift, f.start + shift, f.end + shift};
  }
  // f+, or f* when entered at the split: f's end goes to a split that repeats f or leaves.
  Frag loop(const Frag& f, bool star) {
    const int32_t e = add({});
    const int32_t s = add_split(f.start, e);
    link(f.end, s);
    return {f.begin, star ? s : f.start, e};
  }

  // f{min,max}: min copies, then either a loop on the last (max unbounded: x{m,} = x{m-1}x+)
  // or max-min optional copies, each able to skip to the end. All copies are made from the
  // pristine f before any is linked, since clone() copies f's dangling end as it is.
  Result<Frag> repeat(const Frag& f, Quant q, size_t at) {
    if (q.min == 1 && q.max == 1) return f;
    if (q.min <= 1 && q.max < 0) return loop(f, q.min == 0);
    const int copies = q.max < 0 ? q.min : q.max;
    if (copies == 0) {  // x{0} matches only "": f's states stay unreachable
      const int32_t e = add({});
      return Frag{f.begin, e, e};
    }
    const size_t size = nfa.size() - f.begin;
    if (nfa.size() + size * static_cast<size_t>(copies - 1) > ByteDfa::kMaxNfaStates) return too_big(at);
    std::vector<Frag> c{f};
    for (int i = 1; i < copies; ++i) c.push_back(clone(f, size));
    Frag r{f.begin, -1, -1};
    const auto append = [&](int32_t start, int32_t end) {
      if (r.start < 0) r.start = start;
      else link(r.end, start);
      r.end = end;
    };
    for (int i = 0; i < q.min; ++i) {
      const Frag piece = (q.max < 0 && i == q.min - 1) ? loop(c[i], false) : c[i];
      append(piece.start, piece.end);
    }
    if (q.max > q.min) {
      const int32_t e = add({});
      for (int i = q.min; i < q.max; ++i) append(add_split(c[i].start, e), c[i].end);
      link(r.end, e);
      r.end = e;
    }
    return r;
  }

  // A quantifier at pos_ (advancing past it), or nullopt (pos_ unchanged). Counts saturate
  // just above kMaxRepeat, which the caller rejects, so a huge count cannot overflow.
  std::optional<Quant> quantifier() {
    const char c = p_[pos_];
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      return Quant{c == '+' ? 1 : 0, c == '?' ? 1 : -1};
    }
    if (c != '{') return std::nullopt;
    size_t i = pos_ + 1;
    const auto number = [&](int* v) {
      const size_t from = i;
      *v = 0;
      for (; i < p_.size() && is_digit(p_[i]); ++i) *v = std::min(*v * 10 + (p_[i] - '0'), ByteDfa::kMaxRepeat + 1);
      return i > from;
    };
    Quant q;
    if (!number(&q.min)) return std::nullopt;
    q.max = q.min;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(&q.max)) q.max = -1;
    }
    if (i >= p_.size() || p_[i] != '}') return std::nullopt;
    pos_ = i + 1;
    return q;
  }

  Result<Frag> parse_alt(int depth) {
    std::vector<Frag> branches;
    for (;;) {
      LRA_ASSIGN_OR_RETURN(Frag b, parse_concat(depth));
      branches.push_back(b);
      if (pos_ >= p_.size() || p_[pos_] != '|') break;
      ++pos_;
    }
    if (branches.size() == 1) return branches[0];
    const int32_t end = add({});
    int32_t start = branches.back().start;
    for (size_t i = branches.size(); i-- > 1;) start = add_split(branches[i - 1].start, start);
    for (const Frag& b : branches) link(b.end, end);
    return Frag{branches[0].begin, start, end};
  }

  Result<Frag> parse_concat(int depth) {
    Frag r{static_cast<int32_t>(nfa.size()), -1, -1};
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      LRA_ASSIGN_OR_RETURN(Frag f, parse_piece(depth));
      if (r.start < 0) r.start = f.start;
      else link(r.end, f.start);
      r.end = f.end;
    }
    if (r.start < 0) return empty();
    return r;
  }

  // An atom and its quantifier.
  Result<Frag> parse_piece(int depth) {
    LRA_ASSIGN_OR_RETURN(Frag f, parse_atom(depth));
    bool repeated = false;
    while (pos_ < p_.size()) {
      const size_t at = pos_;
      const std::optional<Quant> q = quantifier();
      if (!q) break;
      if (repeated) return bad(at, "nothing to repeat: a quantifier follows a quantifier");
      repeated = true;
      if (q->min > ByteDfa::kMaxRepeat || q->max > ByteDfa::kMaxRepeat) {
        return bad(at, fmt::format("repetition count above {}", ByteDfa::kMaxRepeat));
      }
      if (q->max >= 0 && q->min > q->max) return bad(at, "bad repetition {m,n}: m is greater than n");
      if (pos_ < p_.size() && p_[pos_] == '?') {
        ++pos_;  // lazy: the same language when the whole string must match
      } else if (pos_ < p_.size() && p_[pos_] == '+') {
        return unsupported(pos_, "possessive quantifiers (a '+' after a quantifier) are not supported");
      }
      LRA_ASSIGN_OR_RETURN(f, repeat(f, *q, at));
    }
    if (nfa.size() > ByteDfa::kMaxNfaStates) return too_big(pos_);
    return f;
  }

  Result<Frag> parse_atom(int depth) {
    const size_t at = pos_;
    switch (p_[pos_]) {
      case '(': return parse_group(depth);
      case '[': return parse_class();
      case '.': ++pos_; return class_frag(negate({{'\n', '\n'}}));
      case '\\': {
        LRA_ASSIGN_OR_RETURN(Atom a, parse_escape(false));
        return a.is_set ? class_frag(a.set) : cp_frag(a.cp);
      }
      case '*': case '+': case '?':
        return bad(at, fmt::format("nothing to repeat: '{}' follows no atom", p_[at]));
      case '{':
        if (quantifier()) return bad(at, "nothing to repeat: '{' quantifier follows no atom");
        break;  // a literal '{'
      case '^':
        return unsupported(at, "'^' is supported only as the first character of the pattern");
      case '$':
        if (at + 1 != p_.size()) return unsupported(at, "'$' is supported only as the last character of the pattern");
        ++pos_;
        return empty();
      default:
        break;
    }
    uint32_t cp = 0;
    const int n = utf8_char(p_, pos_, &cp);
    if (n == 0) return bad(at, "invalid UTF-8");
    pos_ += n;
    return bytes_frag(reinterpret_cast<const uint8_t*>(p_.data() + at), n);
  }

  Result<Frag> parse_group(int depth) {
    const size_t open = pos_;
    if (depth >= kMaxDepth) {
      return bad(open, fmt::format("groups nested deeper than {}", kMaxDepth));
    }
    ++pos_;
    const std::string_view rest = p_.substr(pos_);
    if (rest.starts_with("?")) {
      // Known constructs we do not implement, by the text after '(' (first match wins, so
      // "?<=" comes before the named group "?<").
      static constexpr std::pair<std::string_view, std::string_view> kUnsupported[] = {
          {"?=", "lookahead (?= (?! is not supported"},  {"?!", "lookahead (?= (?! is not supported"},
          {"?<=", "lookbehind (?<= (?<! is not supported"}, {"?<!", "lookbehind (?<= (?<! is not supported"},
          {"?P=", "backreferences (?P=name) are not supported"}, {"?>", "atomic groups (?> are not supported"},
          {"?#", "comments (?# are not supported"},
      };
      for (const auto& [prefix, what] : kUnsupported) {
        if (rest.starts_with(prefix)) return unsupported(open, what);
      }
      if (rest.starts_with("?:")) {
        pos_ += 2;
      } else if (rest.starts_with("?<") || rest.starts_with("?P<")) {
        pos_ += rest[1] == 'P' ? 3 : 2;
        const size_t name = pos_;
        while (pos_ < p_.size() && (is_alpha(p_[pos_]) || is_digit(p_[pos_]) || p_[pos_] == '_')) ++pos_;
        if (pos_ == name || is_digit(p_[name]) || pos_ >= p_.size() || p_[pos_] != '>') {
          return bad(open, "bad group name: want (?<name>...) with name [A-Za-z_][A-Za-z0-9_]*");
        }
        ++pos_;
      } else if (rest.size() > 1 && std::string_view("aiLmsuxnUJ-^").find(rest[1]) != std::string_view::npos) {
        return unsupported(open, "inline flags like (?i) are not supported");
      } else if (rest.size() > 1 && std::string_view("R&+|P0123456789").find(rest[1]) != std::string_view::npos) {
        return unsupported(open, "recursion, subroutine calls and branch reset groups are not supported");
      } else {
        return bad(open, "unknown group construct after '(?'");
      }
    }
    LRA_ASSIGN_OR_RETURN(Frag f, parse_alt(depth + 1));
    if (pos_ >= p_.size()) return bad(open, "unbalanced parenthesis: '(' is never closed");
    ++pos_;  // the ')'
    return f;
  }

  // Exactly `count` hex digits at pos_.
  Result<uint32_t> hex(size_t count, size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < count; ++i, ++pos_) {
      if (pos_ >= p_.size() || !is_hex(p_[pos_])) return bad(at, fmt::format("bad escape, want {} hex digits", count));
      v = v * 16 + hex_value(p_[pos_]);
    }
    return v;
  }

  // \uHHHH, \uHHHH\uHHHH (a surrogate pair) or \u{H...H}; pos_ is past the 'u'.
  Result<uint32_t> unicode_escape(size_t at) {
    uint32_t cp = 0;
    if (pos_ < p_.size() && p_[pos_] == '{') {
      const size_t close = p_.find('}', pos_);
      if (close == std::string_view::npos || close == pos_ + 1 || close > pos_ + 7) {
        return bad(at, "bad escape: want \\u{H...H} with 1 to 6 hex digits");
      }
      ++pos_;
      LRA_ASSIGN_OR_RETURN(cp, hex(close - pos_, at));
      ++pos_;
      if (cp > kMaxCodePoint) return bad(at, "bad escape: code point above U+10FFFF");
    } else {
      LRA_ASSIGN_OR_RETURN(cp, hex(4, at));
      const std::string_view rest = p_.substr(pos_);
      if (cp >= 0xD800 && cp <= 0xDBFF && rest.size() >= 6 && rest.starts_with("\\u") &&
          std::all_of(rest.begin() + 2, rest.begin() + 6, is_hex)) {
        pos_ += 2;
        LRA_ASSIGN_OR_RETURN(uint32_t low, hex(4, at));
        if (low < 0xDC00 || low > 0xDFFF) return bad(at, "bad escape: unpaired surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
      }
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return bad(at, "bad escape: unpaired surrogate (not a character)");
    return cp;
  }

  Result<Atom> parse_escape(bool in_class) {
    const size_t at = pos_;
    if (pos_ + 1 >= p_.size()) return bad(at, "bad escape: trailing backslash");
    const char c = p_[pos_ + 1];
    pos_ += 2;
    const auto set = [](const Ranges& r) { return Atom{true, 0, r}; };
    const auto cp = [](uint32_t v) { return Atom{false, v, {}}; };
    const auto no = [&](std::string_view what) { return unsupported(at, what); };
    switch (c) {
      case 'd': return set(kDigit);
      case 'D': return set(negate(kDigit));
      case 'w': return set(kWord);
      case 'W': return set(negate(kWord));
      case 's': return set(kSpace);
      case 'S': return set(negate(kSpace));
      case 'n': return cp('\n');
      case 'r': return cp('\r');
      case 't': return cp('\t');
      case 'f': return cp('\f');
      case 'v': return cp('\v');
      case '0':
        if (pos_ < p_.size() && is_digit(p_[pos_])) return no("octal escapes are not supported");
        return cp(0);
      case 'x':
      case 'u': {
        LRA_ASSIGN_OR_RETURN(uint32_t v, c == 'x' ? hex(2, at) : unicode_escape(at));
        return cp(v);
      }
      case 'b':
        if (in_class) return cp('\b');  // backspace inside a class, in every flavour
        return no("word boundaries \\b are not supported");
      case 'B': return no("word boundaries \\B are not supported");
      case 'k': return no("backreferences \\k<name> are not supported");
      case 'A': case 'z': case 'Z': case 'G': return no("anchors \\A \\z \\Z \\G are not supported");
      case 'p': case 'P': return no("Unicode property classes \\p \\P are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') return no("backreferences \\1..\\9 are not supported");
    if (is_punct(c)) return cp(static_cast<uint8_t>(c));
    if (is_alpha(c)) return bad(at, fmt::format("bad escape \\{}: unknown letter escape", c));
    return bad(at, "bad escape: a backslash must precede a letter or ASCII punctuation");
  }

  Result<Atom> class_member() {
    if (p_[pos_] == '\\') return parse_escape(true);
    uint32_t cp = 0;
    const int n = utf8_char(p_, pos_, &cp);
    if (n == 0) return bad(pos_, "invalid UTF-8");
    pos_ += n;
    return Atom{false, cp, {}};
  }

  Result<Frag> parse_class() {
    const size_t open = pos_++;
    const bool negated = pos_ < p_.size() && p_[pos_] == '^';
    if (negated) ++pos_;
    Ranges set;
    // A range's '-' is one not followed by the closing ']'.
    const auto at_range_dash = [&] { return pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']'; };
    for (bool first = true;; first = false) {
      if (pos_ >= p_.size()) return bad(open, "unterminated character class: '[' has no ']'");
      if (p_[pos_] == ']' && !first) break;
      if (p_.substr(pos_).starts_with("[:") && p_.find(":]", pos_ + 2) != std::string_view::npos) {
        return unsupported(pos_, "POSIX classes like [:alpha:] are not supported");
      }
      const size_t member = pos_;
      LRA_ASSIGN_OR_RETURN(Atom lo, class_member());
      if (!at_range_dash()) {
        if (lo.is_set) set.insert(set.end(), lo.set.begin(), lo.set.end());
        else set.emplace_back(lo.cp, lo.cp);
        continue;
      }
      ++pos_;
      LRA_ASSIGN_OR_RETURN(Atom hi, class_member());
      if (lo.is_set || hi.is_set) return bad(member, "bad range: a class escape like \\d cannot be a range end");
      if (lo.cp > hi.cp) {
        return bad(member, fmt::format("bad range {}: its end is below its start", p_.substr(member, pos_ - member)));
      }
      set.emplace_back(lo.cp, hi.cp);
    }
    ++pos_;  // the ']'
    return class_frag(negated ? negate(set) : set);
  }

  std::string_view p_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::unique_ptr<ByteDfa>> ByteDfa::compile(std::string_view pattern) {
  Parser parser(pattern);
  LRA_ASSIGN_OR_RETURN(Frag f, parser.parse());
  std::unique_ptr<ByteDfa> dfa(new ByteDfa());
  dfa->nfa_ = std::move(parser.nfa);
  dfa->nfa_.push_back({});  // the match state: no edges
  dfa->match_ = static_cast<int32_t>(dfa->nfa_.size() - 1);
  dfa->nfa_[f.end].out = dfa->match_;
  dfa->nfa_start_ = f.start;
  dfa->compute_liveness();
  dfa->mark_.assign(dfa->nfa_.size(), 0);
  dfa->stack_.push_back(f.start);
  dfa->close();
  if (!dfa->set_.empty()) dfa->start_ = dfa->find_or_add(-1, 0);
  return dfa;
}

// live_[q] = match_ is reachable from q: a breadth-first search from match_ over reversed edges.
void ByteDfa::compute_liveness() {
  const size_t n = nfa_.size();
  const auto for_edges = [&](auto&& f) {
    for (size_t q = 0; q < n; ++q) {
      for (int32_t t : {nfa_[q].out, nfa_[q].out2}) {
        if (t >= 0) f(static_cast<int32_t>(q), t);
      }
    }
  };
  // CSR: the predecessors of t are preds[first[t] .. first[t + 1]), first [n + 2] (counts are
  // summed at t + 2 so that filling through first[t + 1] leaves each range in place).
  std::vector<int32_t> first(n + 2, 0);
  for_edges([&](int32_t, int32_t t) { ++first[t + 2]; });
  for (size_t i = 2; i < n + 2; ++i) first[i] += first[i - 1];
  std::vector<int32_t> preds(first[n + 1]);  // [n_edges]
  for_edges([&](int32_t q, int32_t t) { preds[first[t + 1]++] = q; });
  live_.assign(n, 0);
  live_[match_] = 1;
  std::vector<int32_t> queue{match_};
  for (size_t head = 0; head < queue.size(); ++head) {
    for (int32_t i = first[queue[head]]; i < first[queue[head] + 1]; ++i) {
      if (!live_[preds[i]]) live_[preds[i]] = 1, queue.push_back(preds[i]);
    }
  }
}

void ByteDfa::close() {
  if (++stamp_ == 0) {  // the stamp wrapped: old marks could collide with new ones
    std::fill(mark_.begin(), mark_.end(), 0);
    stamp_ = 1;
  }
  set_.clear();
  while (!stack_.empty()) {
    const int32_t q = stack_.back();
    stack_.pop_back();
    // A dead state leads only to dead states: dropping it here is what makes kDead exact.
    if (!live_[q] || mark_[q] == stamp_) continue;
    mark_[q] = stamp_;
    const NfaState& s = nfa_[q];
    if (consumes(s) || q == match_) {
      set_.push_back(q);
      continue;
    }
    if (s.out >= 0) stack_.push_back(s.out);
    if (s.out2 >= 0) stack_.push_back(s.out2);
  }
  std::sort(set_.begin(), set_.end());
}

void ByteDfa::step(uint8_t byte) {
  for (int32_t q : set_) {
    const NfaState& s = nfa_[q];
    if (consumes(s) && s.lo <= byte && byte <= s.hi) stack_.push_back(s.out);
  }
  close();
}

int32_t ByteDfa::find_or_add(int32_t parent, uint8_t byte) {
  if (const auto it = slot_by_set_.find(set_); it != slot_by_set_.end()) return slot_id_[it->second];
  assert(parent_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()) && "DFA state ids are int32");
  const auto id = static_cast<int32_t>(parent_.size());
  parent_.push_back(parent);
  via_.push_back(byte);
  // A live byte consumer's target is live, so it alone proves a non-empty continuation.
  uint8_t flags = 0;
  for (int32_t q : set_) flags |= q == match_ ? kAccepting : kCanContinue;
  flags_.push_back(flags);
  slot_of_.push_back(-1);
  add_slot(id);
  return id;
}

int32_t ByteDfa::add_slot(int32_t id) {
  if (slot_set_.size() == kMaxCachedStates || cached_entries_ + set_.size() > kMaxCachedSetEntries) {
    for (int32_t cached : cached_ids_) slot_of_[cached] = -1;
    cached_ids_.clear();
    slot_by_set_.clear();
    slot_set_.clear();
    slot_id_.clear();
    rows_.clear();
    cached_entries_ = 0;
  }
  const auto slot = static_cast<int32_t>(slot_set_.size());
  const auto it = slot_by_set_.emplace(set_, slot).first;
  slot_set_.push_back(&it->first);
  slot_id_.push_back(id);
  rows_.resize(rows_.size() + 256, kUnknown);
  cached_entries_ += set_.size();
  slot_of_[id] = slot;
  cached_ids_.push_back(id);
  return slot;
}

int32_t ByteDfa::recache(int32_t id) {
  chain_.clear();
  int32_t cached = id;
  for (; cached >= 0 && slot_of_[cached] < 0; cached = parent_[cached]) chain_.push_back(cached);
  if (cached >= 0) {
    set_ = *slot_set_[slot_of_[cached]];
  } else {  // the path starts at start_ (chain_.back()), whose set is the start closure
    stack_.push_back(nfa_start_);
    close();
    chain_.pop_back();
  }
  for (auto it = chain_.rbegin(); it != chain_.rend(); ++it) step(via_[*it]);
  if (const auto it = slot_by_set_.find(set_); it != slot_by_set_.end()) {
    slot_of_[id] = it->second;
    cached_ids_.push_back(id);
    return it->second;
  }
  return add_slot(id);
}

int32_t ByteDfa::next_slow(int32_t state, uint8_t byte) {
  int32_t slot = slot_of_[state];
  if (slot < 0) slot = recache(state);
  set_ = *slot_set_[slot];
  step(byte);
  const int32_t t = set_.empty() ? kDead : find_or_add(state, byte);
  // Adding t may have dropped the cache, `state`'s slot with it: then there is no row to fill.
  if (slot_of_[state] == slot) rows_[static_cast<size_t>(slot) * 256 + byte] = t;
  return t;
}

}  // namespace lragent::guide
