// GBNF grammars (grammar.h) and their byte automaton (grammar_dfa.h), against references written
// elsewhere: PCRE2's whole and partial (PCRE2_PARTIAL_HARD) matching for random regular grammars,
// nlohmann::json's parser for a JSON grammar, and a plain bracket matcher for a language no regex
// describes. Every state the automaton reaches must say exactly whether the bytes so far can
// still become a whole match (kDead exact) and whether they are one.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <deque>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/guide/byte_dfa.h"
#include "engine/guide/grammar.h"
#include "engine/guide/grammar_dfa.h"
#include "server/reasoning.h"

namespace lragent::guide {
namespace {

std::unique_ptr<GrammarDfa> dfa_of(std::string_view gbnf, std::string_view root = "root") {
  auto g = Grammar::parse(gbnf, root);
  EXPECT_TRUE(g.ok()) << gbnf << "\n" << (g.ok() ? "" : g.error().message);
  if (!g.ok()) return nullptr;
  return std::make_unique<GrammarDfa>(std::move(*g));
}

int32_t walk(GrammarDfa& d, std::string_view text, int32_t s) {
  for (unsigned char c : text) s = d.next(s, c);
  return s;
}
int32_t walk(GrammarDfa& d, std::string_view text) { return walk(d, text, d.start()); }

bool matches(GrammarDfa& d, std::string_view text) { return d.accepting(walk(d, text)); }

std::string error_of(std::string_view gbnf) {
  auto g = Grammar::parse(gbnf);
  return g.ok() ? std::string("(parsed)") : g.error().message;
}

// --- PCRE2 as the reference for regular grammars ---------------------------------------------
class Pcre {
 public:
  explicit Pcre(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    // \z rather than PCRE2_ENDANCHORED, which partial matching refuses.
    const std::string whole = "(?:" + pattern + ")\\z";
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(whole.data()), whole.size(), PCRE2_UTF | PCRE2_DOTALL, &err,
                          &off, nullptr);
    if (code_) md_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Pcre() {
    pcre2_match_data_free(md_);
    pcre2_code_free(code_);
  }
  bool ok() const { return code_ != nullptr; }
  // The whole text matches; or (partial) it is a prefix of some whole match.
  bool whole(const std::string& s) { return run(s, 0) >= 0; }
  bool prefix(const std::string& s) {
    const int rc = run(s, PCRE2_PARTIAL_HARD);
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL;
  }

 private:
  int run(const std::string& s, uint32_t flags) {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                       PCRE2_ANCHORED | flags, md_, nullptr);
  }
  pcre2_code* code_ = nullptr;
  pcre2_match_data* md_ = nullptr;
};

// A random regular expression written twice: as GBNF (with some parts made rules of their own,
// so that calls and returns are exercised) and as a PCRE2 pattern.
struct TwoForms {
  std::string gbnf, pcre;
};

class RandomRegular {
 public:
  explicit RandomRegular(uint32_t seed) : rng_(seed) {}

  // The whole grammar (rules + root) and the pattern.
  TwoForms make() {
    rules_.clear();
    TwoForms root = node(3);
    return {"root ::= " + root.gbnf + "\n" + rules_, root.pcre};
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

  TwoForms leaf() {
    static const char* kChars[] = {"a", "b", "c", "\xc3\xa9"};  // é: two bytes
    switch (pick(4)) {
      case 0: {
        std::string s = kChars[pick(4)];
        if (pick(2)) s += kChars[pick(4)];
        return {"\"" + s + "\"", s};
      }
      case 1: {
        static const char* kClasses[] = {"[a-b]", "[^a]", "[ac]", "[\xc3\xa9-\xc3\xab]", "[^\xc3\xa9\\n]", "[b]"};
        const std::string c = kClasses[pick(6)];
        return {c, c};
      }
      case 2: return {".", "."};
      default: return {"\"\"", ""};  // the empty literal
    }
  }

  TwoForms node(int depth) {
    if (depth == 0 || pick(4) == 0) return leaf();
    TwoForms out;
    switch (pick(6)) {
      case 0: {  // concatenation
        TwoForms a = node(depth - 1), b = node(depth - 1);
        out = {a.gbnf + " " + b.gbnf, "(?:" + a.pcre + ")(?:" + b.pcre + ")"};
        break;
      }
      case 1: {  // alternation, sometimes with an empty branch
        TwoForms a = node(depth - 1), b = pick(4) ? node(depth - 1) : TwoForms{"", ""};
        out = {"(" + a.gbnf + " | " + b.gbnf + ")", "(?:" + a.pcre + "|" + b.pcre + ")"};
        break;
      }
      case 2: {  // postfix repetition
        static const char* kOps[] = {"*", "+", "?", "{2}", "{0,2}", "{1,}"};
        const std::string op = kOps[pick(6)];
        TwoForms a = node(depth - 1);
        out = {"(" + a.gbnf + ")" + op, "(?:" + a.pcre + ")" + op};
        break;
      }
      case 3: {  // a rule of its own
        TwoForms a = node(depth - 1);
        const std::string name = "r" + std::to_string(rules_.size());
        rules_ += name + " ::= " + a.gbnf + "\n";
        out = {name, "(?:" + a.pcre + ")"};
        break;
      }
      default: out = leaf();
    }
    return out;
  }

  std::mt19937 rng_;
  std::string rules_;
};

TEST(Grammar, RegularGrammarsAgreeWithPcre2WholeAndPartial) {
  static const char* kAlphabet[] = {"a", "b", "c", "\xc3\xa9", "\n"};
  std::mt19937 rng(11);
  int checked = 0, whole = 0, dead = 0;
  for (uint32_t seed = 0; seed < 300; ++seed) {
    const TwoForms f = RandomRegular(seed).make();
    SCOPED_TRACE(f.gbnf + "  ~  " + f.pcre);
    Pcre ref(f.pcre);
    ASSERT_TRUE(ref.ok());
    auto d = dfa_of(f.gbnf);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->accepting(d->start()), ref.whole(""));
    for (int k = 0; k < 120; ++k) {
      std::string s;
      const int len = static_cast<int>(rng() % 9);
      int32_t st = d->start();
      for (int i = 0; i < len; ++i) {
        const std::string piece = kAlphabet[rng() % 5];
        s += piece;
        st = walk(*d, piece, st);
        // At every character boundary: alive exactly when PCRE2 sees a prefix of a match.
        ASSERT_EQ(st != GrammarDfa::kDead, ref.prefix(s)) << "'" << s << "'";
        ASSERT_EQ(d->accepting(st), ref.whole(s)) << "'" << s << "'";
        ++checked;
        whole += d->accepting(st);
        if (st == GrammarDfa::kDead) {
          ++dead;
          break;
        }
      }
    }
  }
  // Both outcomes occur often enough for the comparison to mean something.
  EXPECT_GT(whole, 1000);
  EXPECT_GT(dead, 1000);
  EXPECT_GT(checked, 30000);
}

// --- a language no regular expression describes ----------------------------------------------
TEST(Grammar, BalancedBracketsAgainstAStackMatcher) {
  auto d = dfa_of(R"g(root ::= ( "(" root ")" | "[" root "]" | "x" )*)g");
  ASSERT_NE(d, nullptr);
  const std::string alphabet = "()[]x";
  // Every string up to length 7: alive iff no closer mismatches; whole iff also nothing open.
  std::vector<std::string> level{""};
  for (int len = 1; len <= 7; ++len) {
    std::vector<std::string> next;
    for (const std::string& p : level)
      for (char c : alphabet) next.push_back(p + c);
    for (const std::string& s : next) {
      std::string open;
      bool ok = true;
      for (char c : s) {
        if (c == '(' || c == '[') open += c;
        else if (c == ')' || c == ']') {
          if (open.empty() || open.back() != (c == ')' ? '(' : '[')) ok = false;
          else open.pop_back();
        }
        if (!ok) break;
      }
      const int32_t st = walk(*d, s);
      ASSERT_EQ(st != GrammarDfa::kDead, ok) << s;
      ASSERT_EQ(d->accepting(st), ok && open.empty()) << s;
      EXPECT_EQ(d->can_continue(st), ok) << s;  // an open or a closed text can always go on
    }
    level = std::move(next);
  }
  // Deep nesting is a stack, not a blow-up: 20000 levels open and close again.
  const std::string deep = std::string(20000, '(') + std::string(20000, ')');
  EXPECT_TRUE(matches(*d, deep));
  EXPECT_TRUE(d->exhausted().empty());
}

// --- JSON (RFC 8259) against nlohmann::json's parser ------------------------------------------
constexpr const char* kJsonGrammar = R"(# RFC 8259, any value at the top
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
)";

nlohmann::json random_json(std::mt19937& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth > 0 ? 7 : 5));
  switch (kind) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 2000) - 1000;
    case 3: return (static_cast<double>(rng() % 100000) - 50000) / 64.0;
    case 4: {
      static const char* kPieces[] = {"a", "\xc3\xa9", "\"", "\\", "\n", "\x01", "/", "z", " ", "\xe2\x82\xac"};
      std::string s;
      for (int i = static_cast<int>(rng() % 6); i > 0; --i) s += kPieces[rng() % 10];
      return s;
    }
    case 5: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(random_json(rng, depth - 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) o["k" + std::to_string(rng() % 10)] = random_json(rng, depth - 1);
      return o;
    }
  }
}

// nlohmann's parser as a syntax check: a SAX handler that takes every value and fails only on a
// parse error (no document is built).
struct SyntaxOnly {
  using json = nlohmann::json;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(json::string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

bool json_syntax(const std::string& text) {
  SyntaxOnly h;
  return nlohmann::json::sax_parse(text, &h);
}

// The shortest bytes from `s` to a whole match (breadth first over a few likely bytes), or
// nullopt when none is found within the budget.
std::optional<std::string> complete(GrammarDfa& d, int32_t s) {
  const std::string bytes = "0123456789\"}]:,.eE+-tnulfalsr{[ a\\";
  std::deque<std::pair<int32_t, std::string>> q{{s, ""}};
  std::unordered_set<int32_t> seen{s};
  for (int budget = 0; !q.empty() && budget < 50000; ++budget) {
    auto [st, path] = q.front();
    q.pop_front();
    if (d.accepting(st)) return path;
    for (char c : bytes) {
      const int32_t t = d.next(st, static_cast<uint8_t>(c));
      if (t != GrammarDfa::kDead && seen.insert(t).second) q.emplace_back(t, path + c);
    }
  }
  return std::nullopt;
}

TEST(Grammar, JsonGrammarAgreesWithNlohmannJson) {
  auto d = dfa_of(kJsonGrammar);
  ASSERT_NE(d, nullptr);
  std::mt19937 rng(5);
  const std::string edits = "{}[]\",:0123456789.eE+-tfn \\a\x01";  // no 'u': lone \uD800 escapes are nlohmann's to refuse
  int accepted = 0, refused = 0, completed = 0;
  const std::regex big_exponent("[eE][-+]?[0-9]{3,}");
  for (int k = 0; k < 1500; ++k) {
    const nlohmann::json v = random_json(rng, 3);
    std::string text = v.dump(rng() % 3 == 0 ? 1 : -1);
    if (rng() % 4 == 0) text = " \n" + text + "\t";
    ASSERT_TRUE(matches(*d, text)) << text;  // what nlohmann writes, the grammar reads
    for (int e = static_cast<int>(rng() % 3); e >= 0; --e) {  // 1-3 edits
      const size_t at = text.empty() ? 0 : rng() % (text.size() + 1);
      const char c = edits[rng() % edits.size()];
      switch (rng() % 3) {
        case 0: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        case 1: if (at < text.size()) text.erase(at, 1); break;
        default: if (at < text.size()) text[at] = c;
      }
    }
    SCOPED_TRACE(text);
    // nlohmann stops at a number a double cannot hold (1E400) before it has read the rest: leave
    // such texts out, since its verdict would not be about syntax.
    if (std::regex_search(text, big_exponent)) continue;
    const bool ref = json_syntax(text);
    const int32_t st = walk(*d, text);
    ASSERT_EQ(d->accepting(st), ref);
    ref ? ++accepted : ++refused;
    // Alive means some continuation is JSON: find one and let nlohmann judge it.
    if (st != GrammarDfa::kDead && !ref) {
      const auto rest = complete(*d, st);
      ASSERT_TRUE(rest.has_value()) << "no completion found";
      ASSERT_TRUE(json_syntax(text + *rest)) << text + *rest;
      ++completed;
    }
  }
  EXPECT_GT(accepted, 200);
  EXPECT_GT(refused, 200);
  EXPECT_GT(completed, 50);
  EXPECT_TRUE(d->exhausted().empty());
}

// --- the dialect --------------------------------------------------------------------------------
TEST(Grammar, ReadsTheGbnfDialect) {
  // vLLM's documented example, alternatives over several lines and a comment.
  auto sql = dfa_of(R"(root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "   # two columns
table ::= "table_1 "
        | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 ")");
  ASSERT_NE(sql, nullptr);
  EXPECT_TRUE(matches(*sql, "SELECT col_1  from table_2  where col_2 = 1 "));
  EXPECT_FALSE(matches(*sql, "SELECT col_3  from table_2  where col_2 = 1 "));
  // Escapes are code points; \x.. too, as in llama.cpp.
  auto esc = dfa_of(R"(root ::= "\x41\u00e9\U0001F600\t\"\\" [\]\-\x30-\x39]+ . "."?)");
  ASSERT_NE(esc, nullptr);
  EXPECT_TRUE(matches(*esc, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\]-07\n"));
  EXPECT_FALSE(matches(*esc, "A\xe9\xf0\x9f\x98\x80\t\"\\0x"));  // a raw byte E9 is not é
  // Counted repetition, a rule used before it is defined, and x* where x may be empty.
  auto counts = dfa_of("root ::= d{2,3} \"-\" d{2,} (\"a\"?)*\nd ::= [0-9]");
  ASSERT_NE(counts, nullptr);
  EXPECT_TRUE(matches(*counts, "12-34"));
  EXPECT_TRUE(matches(*counts, "123-4567aaa"));
  EXPECT_FALSE(matches(*counts, "1-34"));
  EXPECT_FALSE(matches(*counts, "1234-34"));
  EXPECT_EQ(walk(*counts, "1234"), GrammarDfa::kDead);
  // '.' is any character, newline included; a class is of characters, not bytes.
  auto any = dfa_of("root ::= . [^a]");
  ASSERT_NE(any, nullptr);
  EXPECT_TRUE(matches(*any, "\n\xe2\x82\xac"));
  EXPECT_FALSE(matches(*any, "xa"));
  EXPECT_EQ(walk(*any, "x\xff"), GrammarDfa::kDead);  // not UTF-8
  // Another start rule.
  auto other = dfa_of("root ::= \"a\"\nyes ::= \"b\"", "yes");
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(matches(*other, "b"));
  // Large counts stay in bounds.
  auto big = dfa_of("root ::= [a-z]{0,1000} \"!\"");
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(matches(*big, std::string(1000, 'q') + "!"));
  EXPECT_EQ(walk(*big, std::string(1001, 'q')), GrammarDfa::kDead);
}

TEST(Grammar, RefusesWhatItCannotServeNamingTheRuleAndPlace) {
  struct Case {
    const char* gbnf;
    const char* says;
  };
  const Case cases[] = {
      {"root ::= foo", "rule 'foo' is used but never defined (line 1, column 10)"},
      {"root ::= \"a\"\nroot ::= \"b\"", "rule 'root' is defined twice (first at line 1, column 1) (line 2, column 1)"},
      {"start ::= \"a\"", "there is no rule named 'root'"},
      {"", "the text has no rules"},
      {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
      {"root ::= a \"x\"\na ::= \"y\"? root | \"z\"", "left-recursive"},
      {"root ::= \"a\" root", "rule 'root' can never finish"},
      {"root ::= \"a\" | b\nb ::= [^\\x00-\\U0010FFFF]", "can never finish"},
      {"root ::= \"abc", "unterminated string literal"},
      {"root ::= [abc", "unterminated character class"},
      {"root ::= (\"a\"", "this '(' is never closed"},
      {"root ::= \"a\")", "')' without '('"},
      {"root ::= \"\\q\"", "unknown escape '\\q'"},
      {"root ::= \"\\xZZ\"", "wants 2 hex digits"},
      {"root ::= \"\\uD800\"", "U+D800 is not a character"},
      {"root ::= [z-a]", "range out of order"},
      {"root ::= \"a\"{1001}", "repetition count above 1000"},
      {"root ::= \"a\"{3,2}", "n < m"},
      {"root ::= \"\xff\"", "invalid UTF-8"},
      {"root ::= @", "unexpected '@'"},
      {"root = \"a\"", "expected '::=' after the rule name 'root' (line 1, column 6)"},
      {"\"b\" ::= x", "expected a rule name"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(c.gbnf);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.gbnf << "\n  got: " << e;
  }
  auto tokens = Grammar::parse("root ::= <[1000]>");
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(error_of("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')).find("nested deeper"),
            std::string::npos);
  std::string huge = "root ::= \"a\"\n";
  for (int i = 0; i < 1100; ++i) huge += "r" + std::to_string(i) + " ::= \"a\"{1000}\n";
  EXPECT_NE(error_of(huge).find("too large"), std::string::npos);
}

// An ambiguous grammar whose parses double with each byte stops at its bound with a reason,
// instead of taking memory without end.
TEST(Grammar, AnExplodingAmbiguityIsCutOffWithAReason) {
  auto d = dfa_of(R"(root ::= "(" root "x" | "(" root "y" | "")");
  ASSERT_NE(d, nullptr);
  int32_t s = d->start();
  int n = 0;
  for (; n < 40 && s != GrammarDfa::kDead; ++n) s = d->next(s, '(');
  EXPECT_EQ(s, GrammarDfa::kDead);
  EXPECT_LE(n, 14);  // 2^13 > kMaxStacks
  EXPECT_NE(d->cut().find("too ambiguous"), std::string::npos) << d->cut();
  // Only that text was cut: a shallower one (as the mask's walk of a long token meets the bound
  // before the text the request picks) still goes on to its whole matches.
  EXPECT_TRUE(d->exhausted().empty()) << d->exhausted();
  s = walk(*d, "((((((", d->start());
  ASSERT_NE(s, GrammarDfa::kDead);
  EXPECT_FALSE(d->accepting(s));
  EXPECT_TRUE(d->accepting(walk(*d, "xyyxyx", s)));
  EXPECT_EQ(walk(*d, "xyyxyxx", s), GrammarDfa::kDead);
}

// A start rule whose parses alone pass the bound is refused when the guide is compiled.
TEST(Grammar, AStartPastTheAmbiguityBoundIsRefused) {
  std::string g = "root ::= a0\n";
  for (int i = 0; i < 13; ++i) g += fmt::format("a{} ::= a{} \"x\" | a{} \"y\"\n", i, i + 1, i + 1);
  g += "a13 ::= \"z\"\n";
  auto d = dfa_of(g);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->start(), GrammarDfa::kDead);
  EXPECT_NE(d->cut().find("too ambiguous"), std::string::npos) << d->cut();
}

// The reasoning prefix for grammars reads exactly what reasoning.h's regex prefix reads.
TEST(Grammar, AfterReasoningMatchesTheRegexForm) {
  std::string root;
  const std::string gbnf = grammar_after_reasoning("root ::= \"yes\" | \"no\"", "root", &root);
  EXPECT_EQ(root, "lragent-think");
  auto d = dfa_of(gbnf, root);
  ASSERT_NE(d, nullptr);
  auto re = ByteDfa::compile(server::after_reasoning("yes|no"));
  ASSERT_TRUE(re.ok());
  static const char* kPieces[] = {"<", "/", "t", "h", "i", "n", "k", ">", "yes", "no", " ", "\n", "</think>", "<think>", "\xc3\xa9"};
  std::mt19937 rng(3);
  int whole = 0;
  for (int k = 0; k < 3000; ++k) {
    std::string s;
    int32_t gs = d->start(), rs = (*re)->start();
    for (int i = static_cast<int>(rng() % 12); i > 0; --i) {
      const std::string p = kPieces[rng() % 15];
      s += p;
      gs = walk(*d, p, gs);
      for (unsigned char c : p) rs = (*re)->next(rs, c);
      ASSERT_EQ(gs == GrammarDfa::kDead, rs == ByteDfa::kDead) << s;
      ASSERT_EQ(d->accepting(gs), (*re)->accepting(rs)) << s;
      whole += d->accepting(gs);
    }
  }
  EXPECT_GT(whole, 50);
  // A grammar that already uses the name gets another.
  grammar_after_reasoning("root ::= lragent-think\nlragent-think ::= \"a\"", "root", &root);
  EXPECT_EQ(root, "lragent-think2");
}

// --- Lark's syntax, converted as vLLM converts it ------------------------------------------
std::unique_ptr<GrammarDfa> dfa_of_lark(std::string_view lark) {
  std::string root;
  auto gbnf = lark_to_gbnf(lark, &root);
  EXPECT_TRUE(gbnf.ok()) << lark << "\n" << (gbnf.ok() ? "" : gbnf.error().message);
  if (!gbnf.ok()) return nullptr;
  return dfa_of(*gbnf, root);
}

TEST(Grammar, LarkGrammarsReadAsTheirGbnfTwins) {
  EXPECT_TRUE(looks_like_lark("rule: 'hello'"));
  EXPECT_TRUE(looks_like_lark("start: a  // a ::= b in a comment\na: \"x\""));
  EXPECT_FALSE(looks_like_lark("root ::= \"a\""));
  EXPECT_FALSE(looks_like_lark("# only a comment\n"));
  // vLLM's own example: the first rule starts.
  auto hello = dfa_of_lark("rule: 'hello'");
  ASSERT_NE(hello, nullptr);
  EXPECT_TRUE(matches(*hello, "hello"));
  EXPECT_FALSE(matches(*hello, "hell"));
  // Every construct, against a GBNF grammar written by hand for the same language, on random
  // texts over the characters both use.
  const char* lark = R"(// a list of numbered items
?start: item ("," ws item)* [";"]
item: NUMBER ":" WORD -> named
    | "'" WORD "'"       // a quoted word
    | "#" DIGIT ~ 2..3   # a tag
NUMBER: DIGIT+
DIGIT: "0".."9"
WORD: ("a".."c")~2
ws: " "?
)";
  const char* twin = R"(root ::= item ("," " "? item)* ";"?
item ::= [0-9]+ ":" [a-c]{2} | "'" [a-c]{2} "'" | "#" [0-9]{2,3}
)";
  auto a = dfa_of_lark(lark);
  auto b = dfa_of(twin);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // Texts of the language, half of them then edited at one random place.
  static const char* kItems[] = {"12:ab", "7:cc", "'ba'", "#123", "#09", "0:ca"};
  const std::string edits = "0129abc:,; '#";
  std::mt19937 rng(8);
  int whole = 0;
  for (int k = 0; k < 4000; ++k) {
    std::string t = kItems[rng() % 6];
    for (int i = static_cast<int>(rng() % 3); i > 0; --i) t += std::string(rng() % 2 ? ", " : ",") + kItems[rng() % 6];
    if (rng() % 2) t += ";";
    if (rng() % 2) {
      const size_t at = rng() % (t.size() + 1);
      if (rng() % 2 && at < t.size()) t.erase(at, 1);
      else t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), edits[rng() % edits.size()]);
    }
    const int32_t sa = walk(*a, t), sb = walk(*b, t);
    ASSERT_EQ(sa == GrammarDfa::kDead, sb == GrammarDfa::kDead) << t;
    ASSERT_EQ(a->accepting(sa), b->accepting(sb)) << t;
    whole += a->accepting(sa);
  }
  EXPECT_GT(whole, 1000);
  EXPECT_LT(whole, 3900);
  EXPECT_TRUE(matches(*a, "12:ab, 'cc',#123;"));
  // `start` starts even when it is not first.
  auto later = dfa_of_lark("x: \"a\"\nstart: x x");
  ASSERT_NE(later, nullptr);
  EXPECT_TRUE(matches(*later, "aa"));
}

TEST(Grammar, LarkWhatCannotBeConvertedNamesItsLine) {
  struct Case {
    const char* lark;
    ErrorCode code;
    const char* says;
  };
  const Case cases[] = {
      {"start: value\n%import common.WS", ErrorCode::kUnsupported, "line 2: directives"},
      {"start: /[a-z]+/", ErrorCode::kUnsupported, "line 1: regular expressions"},
      {"start: \"abc\"i", ErrorCode::kUnsupported, "literal flags"},
      {"| \"a\"\nstart: \"b\"", ErrorCode::kInvalidArgument, "line 1: an alternative '|' before any rule"},
      {"start: \"abc", ErrorCode::kInvalidArgument, "unterminated string literal"},
      {"start: \"ab\"..\"z\"", ErrorCode::kInvalidArgument, "one character at each end"},
      {"start: x ~", ErrorCode::kInvalidArgument, "'~' wants a count"},
      {"start: \"a\"\n  \"b\"", ErrorCode::kInvalidArgument, "line 2: expected a rule"},
      {"start: \"a\"\nstart: \"b\"", ErrorCode::kInvalidArgument, "rule 'start' is defined twice"},
      {"start = \"a\"", ErrorCode::kInvalidArgument, "expected ':' after the rule name 'start'"},
  };
  for (const Case& c : cases) {
    std::string root;
    auto g = lark_to_gbnf(c.lark, &root);
    ASSERT_FALSE(g.ok()) << c.lark;
    EXPECT_EQ(g.error().code, c.code) << c.lark;
    EXPECT_NE(g.error().message.find(c.says), std::string::npos) << c.lark << "\n  got: " << g.error().message;
  }
}

}  // namespace
}  // namespace lragent::guide
