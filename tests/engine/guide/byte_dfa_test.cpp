// ByteDfa against references nobody here wrote: std::regex (ECMAScript, regex_match on whole
// strings) for the ASCII dialect shared with ECMAScript, hand-written and random; glibc's iconv
// (a strict UTF-8 decoder and encoder) for what `.` and classes accept among byte sequences.
// Features std::regex lacks (named groups, \u{..}, UTF-8 characters) are checked by hand.
#include <gtest/gtest.h>
#include <iconv.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "engine/guide/byte_dfa.h"

namespace lragent::guide {
namespace {

std::unique_ptr<ByteDfa> compile_ok(std::string_view pattern) {
  auto r = ByteDfa::compile(pattern);
  if (!r.ok()) {
    ADD_FAILURE() << "compile(\"" << pattern << "\"): " << r.error().message;
    return nullptr;
  }
  return std::move(r).value();
}

int32_t walk(ByteDfa& d, std::string_view s, int32_t from) {
  for (char c : s) from = d.next(from, static_cast<uint8_t>(c));
  return from;
}
int32_t walk(ByteDfa& d, std::string_view s) { return walk(d, s, d.start()); }
bool full_match(ByteDfa& d, std::string_view s) { return d.accepting(walk(d, s)); }

bool ref_match(const std::regex& re, const std::string& s) { return std::regex_match(s, re); }

// Compares verdicts on every input and, for each input std::regex matches, that no prefix of
// it is kDead. Returns how many inputs matched, so callers can tell a vacuous run.
int expect_same_as_std_regex(const std::string& pattern, const std::vector<std::string>& inputs) {
  auto dfa = compile_ok(pattern);
  if (!dfa) return 0;
  const std::regex re(pattern, std::regex::ECMAScript);
  int matched = 0;
  for (const std::string& s : inputs) {
    const bool want = ref_match(re, s);
    EXPECT_EQ(full_match(*dfa, s), want) << "pattern \"" << pattern << "\" input \"" << s << "\"";
    if (!want) continue;
    ++matched;
    int32_t st = dfa->start();
    for (size_t i = 0; i <= s.size(); ++i) {
      EXPECT_NE(st, ByteDfa::kDead) << "pattern \"" << pattern << "\": prefix of length " << i << " of \"" << s
                                    << "\" is dead";
      if (i < s.size()) st = dfa->next(st, static_cast<uint8_t>(s[i]));
    }
  }
  return matched;
}

TEST(ByteDfaHand, AgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "abc", "a|b|", "(ab)*c", "a*b+c?", "a{2}", "a{2,}", "a{2,4}", "a{0}", "a{0,1}b{1}", "(a|ab)(c|bcd)",
      "(a*)*", "(a|)*b", "(?:ab|a)+", "[abc]+", "[^abc]*", "[a-c0-9]", "[-a]", "[a-]", "[\\-a]", "\\d+",
      "\\w*", "\\s", "\\D\\W\\S", "a.c", ".*", "\\.\\*\\+\\?", "\\(\\)", "[\\]\\-]+", "\\x41", "\\u0041",
      "\\t\\n", "a*?b", "a+?", "a{1,3}?b", "((a|b)c)*", "(a|b)*abb", "x(y(z)?)?", "^abc$", "[.]", "a||b",
      "()", "(|a)+", "[^-]", "[\\s\\d]+", "[^\\w]", "(a{2}){2}", "(a{1,2}){2,3}", "(?:a|b){0,3}c", ".{2,}",
      "[\\n]", "\\\\", "\\/", "[a-a]", "(?:(?:a)+)+", "[^a-c\\d]",
  };
  const std::vector<std::string> inputs = {
      "", "a", "b", "c", "ab", "abc", "aa", "aaa", "aaaa", "aaaaa", "abb", "aabb", "babb", "abcd", "ac",
      "abbc", "bc", "bcd", "abcbcd", "0", "09", "a0", "-", "a-", " ", "\t\n", "\n", "A", "x", "xy", "xyz",
      ".", "*", ".*+?", "()", "]", "]-", "\\", "/", "_", "a_1", "acac", "aaac", "bbc", "ababc", "abab",
  };
  int matched = 0;
  for (const std::string& p : patterns) matched += expect_same_as_std_regex(p, inputs);
  EXPECT_GT(matched, 150);  // the inputs exercise matches, not only rejections
}

struct Expect {
  std::string pattern;
  std::string input;
  bool match;
};

// Dialect points where std::regex differs or has no equivalent.
TEST(ByteDfaHand, DialectBeyondStdRegex) {
  const std::vector<Expect> cases = {
      {"(?<name>ab)+", "abab", true},   {"(?<name>ab)+", "aba", false}, {"(?P<x>a|b)c", "bc", true},
      {"a{", "a{", true},               {"a{,2}", "a{,2}", true},       {"a{,2}", "aa", false},
      {"a{1,2", "a{1,2", true},         {"{}", "{}", true},             {"x{a}", "x{a}", true},
      {"[]a]", "]", true},              {"[]a]", "a", true},            {"[]a]", "b", false},
      {"[^]a]", "b", true},             {"[^]a]", "]", false},          {"[\\b]", "\b", true},
      {".", "\r", true},                {".", "\n", false},             {"^$", "", true},
      {"^", "", true},                  {"$", "", true},                {"^a|b$", "b", true},
      {"a*?", "aaa", true},             {"a??", "", true},              {"a{2}?", "aa", true},
      {"a\\0b", std::string("a\0b", 3), true},                          {"\\x7e", "~", true},
      {"\\u{41}\\u{000042}", "AB", true}, {"\\v\\f\\r", "\v\f\r", true}, {"[\\x30-\\x32]", "2", true},
      {"\\%\\#\\@\\~\\`\\'\\\"\\<\\>", "%#@~`'\"<>", true},
  };
  for (const Expect& c : cases) {
    auto dfa = compile_ok(c.pattern);
    ASSERT_NE(dfa, nullptr);
    EXPECT_EQ(full_match(*dfa, c.input), c.match) << "pattern \"" << c.pattern << "\" input \"" << c.input << "\"";
  }
}

TEST(ByteDfaUtf8, HandCases) {
  const std::string e_acute = "\xC3\xA9", zhong = "\xE4\xB8\xAD", wen = "\xE6\x96\x87";
  const std::string grin = "\xF0\x9F\x98\x80", grin1 = "\xF0\x9F\x98\x81", grin2 = "\xF0\x9F\x98\x82";
  const std::vector<Expect> cases = {
      {".", e_acute, true}, {".", zhong, true}, {".", grin, true}, {".", "\xF4\x8F\xBF\xBF", true},
      {".", "\xDF\xBF", true}, {".", "\xE0\xA0\x80", true}, {".", "\xEF\xBF\xBF", true},
      {".", "\xC3", false},  // a lone lead byte
      {".", "\xC0\x80", false}, {".", "\xC1\xBF", false}, {".", "\xE0\x80\x80", false},  // overlong
      {".", "\xED\xA0\x80", false},                                                       // surrogate
      {".", "\xF4\x90\x80\x80", false},                                                   // > U+10FFFF
      {".", "\xF8\x88\x80\x80\x80", false}, {".", "\xFF", false}, {".", "\x80", false},
      {"..", e_acute, false}, {".", e_acute + e_acute, false},
      {e_acute + "+", e_acute + e_acute, true}, {e_acute + "+", e_acute + "\xC3", false},
      {"[" + e_acute + zhong + grin + "]", zhong, true}, {"[" + e_acute + zhong + grin + "]", grin, true},
      {"[" + e_acute + zhong + grin + "]", "e", false}, {"[" + e_acute + zhong + grin + "]", zhong + zhong, false},
      {"[\xC3\xA0-\xC3\xBC]+", "\xC3\xA0" + e_acute + "\xC3\xBC", true}, {"[\xC3\xA0-\xC3\xBC]+", "a" + e_acute, false},
      {"[^" + e_acute + "]", "e", true}, {"[^" + e_acute + "]", zhong, true}, {"[^" + e_acute + "]", grin, true},
      {"[^" + e_acute + "]", "\n", true}, {"[^" + e_acute + "]", e_acute, false}, {"[^" + e_acute + "]", "\xC3", false},
      {"[^" + e_acute + "]", "\xC3\xA8", true}, {"[^" + e_acute + "]", "\xED\xA0\x80", false},
      {"[^a-z]", zhong, true}, {"[^a-z]", "q", false},
      {"[" + grin + "-" + grin2 + "]", grin1, true}, {"[" + grin + "-" + grin2 + "]", "\xF0\x9F\x98\x83", false},
      {"[\\u4e00-\\u9fff]+", zhong + wen, true}, {"[\\u4e00-\\u9fff]+", zhong + "a", false},
      {"\\D\\W\\S", zhong + e_acute + grin, true}, {"\\d", "\xD9\xA3", false},  // Arabic-Indic 3: \d is ASCII
      {"\\xE9", e_acute, true}, {"\\xE9", "\xE9", false}, {"\\u00e9", e_acute, true},
      {"\\uD83D\\uDE00", grin, true}, {"\\u{1F600}", grin, true},
      {"[\\uD83D\\uDE00-\\uD83D\\uDE02]", grin1, true},
      {zhong + ".*" + wen, zhong + "abc" + wen, true}, {"(" + e_acute + "|" + zhong + "){2}", e_acute + zhong, true},
  };
  for (const Expect& c : cases) {
    auto dfa = compile_ok(c.pattern);
    ASSERT_NE(dfa, nullptr);
    EXPECT_EQ(full_match(*dfa, c.input), c.match) << "pattern \"" << c.pattern << "\" input \"" << c.input << "\"";
  }
  // Liveness inside a character: a prefix of a well-formed character lives, one of none dies.
  auto dot = compile_ok(".");
  ASSERT_NE(dot, nullptr);
  for (std::string alive : {"\xC3", "\xE0\xA0", "\xF0\x90", "\xF4\x8F\xBF"}) {
    const int32_t st = walk(*dot, alive);
    EXPECT_TRUE(st != ByteDfa::kDead && !dot->accepting(st) && dot->can_continue(st)) << alive.size();
  }
  for (std::string dead : {"\xC0", "\xC1", "\xE0\x80", "\xED\xA0", "\xF4\x90", "\xF5", "\x80", "\n"}) {
    EXPECT_EQ(walk(*dot, dead), ByteDfa::kDead) << static_cast<int>(static_cast<uint8_t>(dead[0]));
  }
}

// glibc's iconv: is `s` exactly one or more well-formed UTF-8 characters, and how many.
int iconv_chars(const std::string& s) {
  iconv_t cd = iconv_open("UTF-32LE", "UTF-8");
  if (cd == reinterpret_cast<iconv_t>(-1)) return -2;
  char out[64];
  char* in = const_cast<char*>(s.data());
  size_t in_left = s.size(), out_left = sizeof(out);
  char* o = out;
  const size_t r = iconv(cd, &in, &in_left, &o, &out_left);
  iconv_close(cd);
  if (r == static_cast<size_t>(-1) || in_left != 0) return -1;
  return static_cast<int>((sizeof(out) - out_left) / 4);
}

// glibc's iconv as the encoder; "" for a surrogate (not a character).
std::string iconv_encode(uint32_t cp) {
  iconv_t cd = iconv_open("UTF-8", "UTF-32LE");
  char in_buf[4] = {static_cast<char>(cp), static_cast<char>(cp >> 8), static_cast<char>(cp >> 16), 0};
  char out[8];
  char* in = in_buf;
  char* o = out;
  size_t in_left = 4, out_left = sizeof(out);
  const size_t r = iconv(cd, &in, &in_left, &o, &out_left);
  iconv_close(cd);
  if (r == static_cast<size_t>(-1)) return "";
  return std::string(out, sizeof(out) - out_left);
}

// `.` over every 1- and 2-byte string, and 3- and 4-byte strings with every first two bytes
// and boundary values for the rest: matches iff iconv reads exactly one character, not \n.
TEST(ByteDfaUtf8, DotAgreesWithIconv) {
  ASSERT_EQ(iconv_chars("\xC3\xA9"), 1) << "iconv UTF-8 -> UTF-32LE unavailable";
  auto dot = compile_ok(".");
  ASSERT_NE(dot, nullptr);
  std::vector<std::string> inputs;
  for (int a = 0; a < 256; ++a) {
    inputs.push_back(std::string(1, static_cast<char>(a)));
    for (int b = 0; b < 256; ++b) {
      const std::string ab{static_cast<char>(a), static_cast<char>(b)};
      inputs.push_back(ab);
      if (a < 0xE0 || a > 0xF7) continue;  // longer strings only from 3- and 4-byte lead bytes (and a few bad)
      for (char c : {'\x7F', '\x80', '\xBF', '\xC0'}) {
        inputs.push_back(ab + c);
        if (a >= 0xF0) for (char d : {'\x80', '\xBF', '\xC0'}) inputs.push_back(ab + c + d);
      }
    }
  }
  int matched = 0;
  for (const std::string& s : inputs) {
    const bool want = iconv_chars(s) == 1 && s != "\n";
    matched += want;
    EXPECT_EQ(full_match(*dot, s), want) << "bytes " << testing::PrintToString(s);
  }
  EXPECT_GT(matched, 2000);
}

// Random code point ranges [lo, hi] (boundaries of the UTF-8 lengths, the surrogates, the
// 64-blocks the construction splits at) against code points near them, encoded by iconv.
TEST(ByteDfaUtf8, ClassRangesAgreeWithIconvEncoding) {
  std::mt19937 rng(1234);
  const std::vector<uint32_t> edges = {0x00, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xD800, 0xDFFF,
                                       0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF, 0x10FFFE, 0x3F, 0x40};
  const auto pick = [&] {
    const uint32_t e = edges[rng() % edges.size()];
    switch (rng() % 3) {
      case 0: return e;
      case 1: return std::min<uint32_t>(0x10FFFF, e + rng() % 200);
      default: return static_cast<uint32_t>(rng() % 0x110000);
    }
  };
  int checked = 0;
  for (int iter = 0; iter < 150; ++iter) {
    uint32_t lo = pick(), hi = pick();
    if (lo > hi) std::swap(lo, hi);
    // \u{D800} is no character, so not a range end; a range may still span the surrogates.
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xD7FF;
    if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xE000;
    const bool negated = iter % 3 == 0;
    const std::string pattern = fmt::format("[{}\\u{{{:X}}}-\\u{{{:X}}}]", negated ? "^" : "", lo, hi);
    auto dfa = compile_ok(pattern);
    ASSERT_NE(dfa, nullptr);
    const uint32_t near[] = {lo > 0 ? lo - 1 : lo, lo, hi, std::min<uint32_t>(hi + 1, 0x10FFFF)};
    for (int k = 0; k < 60; ++k) {
      const uint32_t cp = k < 4 ? near[k] : pick();
      const std::string bytes = iconv_encode(cp);
      if (bytes.empty()) continue;  // a surrogate has no encoding
      ++checked;
      const bool in = cp >= lo && cp <= hi;
      EXPECT_EQ(full_match(*dfa, bytes), in != negated) << pattern << " U+" << std::hex << cp;
    }
  }
  EXPECT_GT(checked, 6000);
}

// A small grammar over the alphabet "ab01-" in ECMAScript's syntax.
class PatternGen {
 public:
  explicit PatternGen(uint32_t seed) : rng_(seed) {}
  std::string pattern() { return alt(0); }
  int r(int n) { return static_cast<int>(rng_() % n); }

 private:
  std::string alt(int depth) {
    std::string s = concat(depth);
    while (r(4) == 0) s += "|" + concat(depth);
    return s;
  }
  std::string concat(int depth) {
    std::string s;
    for (int n = r(4); n > 0; --n) s += piece(depth);
    return s;
  }
  std::string piece(int depth) {
    std::string s = atom(depth);
    const int m = r(3), n = m + r(3);
    switch (r(12)) {
      case 0: s += "*"; break;
      case 1: s += "+"; break;
      case 2: s += "?"; break;
      case 3: s += fmt::format("{{{}}}", m); break;
      case 4: s += fmt::format("{{{},}}", m); break;
      case 5: s += fmt::format("{{{},{}}}", m, n); break;
      default: return s;
    }
    if (r(5) == 0) s += "?";  // lazy
    return s;
  }
  std::string atom(int depth) {
    static const char* kEscapes[] = {"\\d", "\\w", "\\s", "\\D", "\\W", "\\S"};
    static const char* kMembers[] = {"a", "b", "0", "1", "a-b", "0-1", "0-a", "\\d", "\\w", "\\s", "\\-"};
    switch (r(12)) {
      case 0: return ".";
      case 1: return kEscapes[r(6)];
      case 2:
      case 3: {
        std::string c = r(2) ? "[" : "[^";
        for (int n = 1 + r(3); n > 0; --n) c += kMembers[r(11)];
        if (r(4) == 0) c += "-";  // a literal '-' last
        return c + "]";
      }
      case 4:
      case 5:
        if (depth < 3) return (r(2) ? "(" : "(?:") + alt(depth + 1) + ")";
        break;
      default:
        break;
    }
    return std::string(1, "ab01-"[r(5)]);
  }

  std::mt19937 rng_;
};

TEST(ByteDfaRandom, AgreesWithStdRegex) {
  PatternGen gen(20240611);
  const std::string alphabet = "ab01-ab01-c \n";  // the literals weighted, plus bytes no literal names
  int pairs = 0, matched = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    const std::string pattern = gen.pattern();
    std::vector<std::string> inputs;
    for (int k = 0; k < 12; ++k) {
      std::string s(gen.r(13), ' ');
      for (char& c : s) c = alphabet[gen.r(static_cast<int>(alphabet.size()))];
      inputs.push_back(s);
    }
    // Strings the DFA itself accepts, by random walks that avoid kDead: std::regex must match
    // them too, so positives are tested even where random strings rarely match.
    auto dfa = compile_ok(pattern);
    ASSERT_NE(dfa, nullptr);
    for (int k = 0; k < 6; ++k) {
      std::string s;
      int32_t st = dfa->start();
      // Bounded tries: a state may continue only with bytes outside the alphabet.
      for (int tries = 0; tries < 100 && s.size() < 12 && !(dfa->accepting(st) && gen.r(3) == 0); ++tries) {
        const char c = alphabet[gen.r(static_cast<int>(alphabet.size()))];
        if (const int32_t t = dfa->next(st, static_cast<uint8_t>(c)); t != ByteDfa::kDead) st = t, s += c;
      }
      if (dfa->accepting(st)) inputs.push_back(s);
    }
    pairs += static_cast<int>(inputs.size());
    matched += expect_same_as_std_regex(pattern, inputs);
    if (testing::Test::HasFailure()) {
      ADD_FAILURE() << "stopping at pattern \"" << pattern << "\"";
      return;
    }
  }
  EXPECT_GT(pairs, 15000);
  EXPECT_GT(matched, 5000);
}

TEST(ByteDfaStates, AcceptingAndCanContinue) {
  auto abc = compile_ok("abc");
  ASSERT_NE(abc, nullptr);
  for (std::string prefix : {"", "a", "ab"}) {
    const int32_t st = walk(*abc, prefix);
    EXPECT_TRUE(st != ByteDfa::kDead && !abc->accepting(st) && abc->can_continue(st)) << prefix;
  }
  const int32_t done = walk(*abc, "abc");
  EXPECT_TRUE(abc->accepting(done));
  EXPECT_FALSE(abc->can_continue(done));
  EXPECT_EQ(abc->next(done, 'c'), ByteDfa::kDead);
  EXPECT_EQ(walk(*abc, "abd"), ByteDfa::kDead);
  EXPECT_EQ(abc->next(ByteDfa::kDead, 'a'), ByteDfa::kDead);
  EXPECT_FALSE(abc->accepting(ByteDfa::kDead));
  EXPECT_FALSE(abc->can_continue(ByteDfa::kDead));

  auto star = compile_ok("a*");
  ASSERT_NE(star, nullptr);
  for (std::string prefix : {"", "a", "aaaa"}) {
    const int32_t st = walk(*star, prefix);
    EXPECT_TRUE(star->accepting(st) && star->can_continue(st)) << prefix;
  }
  EXPECT_EQ(walk(*star, "ab"), ByteDfa::kDead);
  EXPECT_EQ(walk(*star, "aaaa"), walk(*star, "a"));  // one state for every a^n, n >= 1
  EXPECT_LE(star->states(), 2u);

  auto opt = compile_ok("a|ab");
  ASSERT_NE(opt, nullptr);
  EXPECT_TRUE(opt->accepting(walk(*opt, "a")) && opt->can_continue(walk(*opt, "a")));

  auto empty = compile_ok("");
  ASSERT_NE(empty, nullptr);
  EXPECT_TRUE(empty->accepting(empty->start()));
  EXPECT_FALSE(empty->can_continue(empty->start()));
}

// kDead is exact: a prefix dies as soon as no string with it can match, even when the NFA
// still has states for it (a branch that can never reach the end).
TEST(ByteDfaStates, DeadIsExact) {
  for (const char* none : {"[^\\s\\S]", "(a|b)c[^\\s\\S]", "a{0}[^\\d\\D]"}) {
    auto dfa = compile_ok(none);
    ASSERT_NE(dfa, nullptr);
    EXPECT_EQ(dfa->start(), ByteDfa::kDead) << none;
    EXPECT_EQ(dfa->states(), 0u) << none;
  }
  auto dfa = compile_ok("a[^\\s\\S]|b(c[^\\s\\S]|d)");
  ASSERT_NE(dfa, nullptr);
  EXPECT_EQ(walk(*dfa, "a"), ByteDfa::kDead);
  EXPECT_EQ(walk(*dfa, "bc"), ByteDfa::kDead);
  EXPECT_TRUE(dfa->accepting(walk(*dfa, "bd")));
  EXPECT_FALSE(dfa->can_continue(walk(*dfa, "bd")));
}

TEST(ByteDfaSize, LargeRepetitions) {
  auto big = compile_ok("[a-z]{1000}");
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(full_match(*big, std::string(1000, 'x')));
  const int32_t short_by_one = walk(*big, std::string(999, 'x'));
  EXPECT_TRUE(!big->accepting(short_by_one) && big->can_continue(short_by_one));
  EXPECT_EQ(walk(*big, std::string(1001, 'x')), ByteDfa::kDead);
  EXPECT_EQ(walk(*big, std::string(500, 'x') + "A"), ByteDfa::kDead);

  auto dots = compile_ok(".{1000}");
  ASSERT_NE(dots, nullptr);
  std::string mixed;
  for (int i = 0; i < 250; ++i) mixed += "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  EXPECT_TRUE(full_match(*dots, mixed));

  auto ranged = compile_ok("(?:ab){2,1000}");
  ASSERT_NE(ranged, nullptr);
  EXPECT_FALSE(full_match(*ranged, "ab"));
  std::string abs;
  for (int i = 0; i < 1000; ++i) abs += "ab";
  EXPECT_TRUE(full_match(*ranged, abs));
  EXPECT_FALSE(full_match(*ranged, abs + "ab"));

  for (const char* too_big : {"(a|b){2000}", "x{1001}", "a{0,5000}", "((a|b){1000}){1000}", "(?:a{1000}){300}"}) {
    auto r = ByteDfa::compile(too_big);
    ASSERT_FALSE(r.ok()) << too_big;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument) << too_big;
  }
}

// (a|b)*a(a|b){15} needs 2^16 DFA states: random walks reach more than the cache holds, so it
// is dropped and refilled several times, and the verdicts must not change. Ids taken before
// the first drop (every prefix of one long string) must still work after the last: their sets
// are rebuilt by replaying the path that first reached them.
TEST(ByteDfaSize, StateCapKeepsAnswersAndIds) {
  const std::string pattern = "(a|b)*a(a|b){15}";
  auto dfa = compile_ok(pattern);
  ASSERT_NE(dfa, nullptr);
  const std::regex re(pattern, std::regex::ECMAScript);
  std::mt19937 rng(77);
  const auto random_ab = [&](size_t n) {
    std::string s(n, 'a');
    for (char& c : s) c = "ab"[rng() % 2];
    return s;
  };
  const std::string held = random_ab(120);
  std::vector<int32_t> held_ids = {dfa->start()};  // [i]: the state after held[0, i)
  for (char c : held) held_ids.push_back(dfa->next(held_ids.back(), static_cast<uint8_t>(c)));
  // Rounds, so that ids cached again after one drop (some sharing a newer id's slot) go
  // through another drop.
  for (int round = 0; round < 3; ++round) {
    for (int iter = 0; iter < 1500; ++iter) {
      const std::string s = random_ab(rng() % 61);
      ASSERT_EQ(full_match(*dfa, s), ref_match(re, s)) << s;
    }
    for (size_t i = 0; i < held_ids.size(); i += 3) {
      const std::string tail = random_ab(rng() % 20);
      EXPECT_EQ(dfa->accepting(held_ids[i]), ref_match(re, held.substr(0, i))) << i;
      EXPECT_EQ(dfa->accepting(walk(*dfa, tail, held_ids[i])), ref_match(re, held.substr(0, i) + tail)) << i;
    }
  }
  EXPECT_GT(dfa->states(), 2 * ByteDfa::kMaxCachedStates);
}

struct ErrorCase {
  std::string pattern;
  ErrorCode code;
  std::string says;  // a part of the message naming the problem
};

TEST(ByteDfaErrors, NameTheProblemAndOffset) {
  const ErrorCode bad = ErrorCode::kInvalidArgument, no = ErrorCode::kUnsupported;
  const std::vector<ErrorCase> cases = {
      {"(ab", bad, "'(' is never closed (at byte 0)"},
      {"a(b(c)", bad, "'(' is never closed (at byte 1)"},
      {"ab)", bad, "')' without '(' (at byte 2)"},
      {"[abc", bad, "unterminated character class"},
      {"[]", bad, "unterminated character class"},
      {"x[z-a]", bad, "bad range z-a: its end is below its start (at byte 2)"},
      {"[\\d-z]", bad, "cannot be a range end"},
      {"*a", bad, "nothing to repeat"},
      {"a**", bad, "nothing to repeat: a quantifier follows a quantifier (at byte 2)"},
      {"a|+", bad, "nothing to repeat: '+' follows no atom (at byte 2)"},
      {"({2})", bad, "nothing to repeat"},
      {"a{3,2}", bad, "m is greater than n"},
      {"a{1001}", bad, "repetition count above 1000"},
      {"a{99999999999999999999}", bad, "repetition count above 1000"},
      {"\\q", bad, "bad escape \\q: unknown letter escape"},
      {"ab\\", bad, "trailing backslash (at byte 2)"},
      {"\\ ", bad, "bad escape"},
      {"\\x4", bad, "2 hex digits"},
      {"\\u12G4", bad, "4 hex digits"},
      {"\\u{110000}", bad, "above U+10FFFF"},
      {"\\u{}", bad, "1 to 6 hex digits"},
      {"\\uD800", bad, "unpaired surrogate"},
      {"\\uD800\\u0041", bad, "unpaired surrogate"},
      {"a\xC3", bad, "invalid UTF-8 (at byte 1)"},
      {"\xFF", bad, "invalid UTF-8"},
      {"[\xC0\x80]", bad, "invalid UTF-8 (at byte 1)"},
      {"\xED\xA0\x80", bad, "invalid UTF-8"},
      {"(?<1a>x)", bad, "bad group name"},
      {"(?<a x)", bad, "bad group name"},
      {"(?Zx)", bad, "unknown group construct"},
      {std::string(600, '(') + std::string(600, ')'), bad, "nested deeper than 500"},
      {"(a)\\1", no, "backreferences"},
      {"(?<n>a)\\k<n>", no, "backreferences"},
      {"(?P<n>a)(?P=n)", no, "backreferences"},
      {"\\bfoo", no, "word boundaries"},
      {"a\\B", no, "word boundaries"},
      {"(?=a)a", no, "lookahead"},
      {"(?!a)b", no, "lookahead"},
      {"(?<=a)b", no, "lookbehind"},
      {"(?<!a)b", no, "lookbehind"},
      {"(?i)abc", no, "inline flags"},
      {"(?s:.)", no, "inline flags"},
      {"a*+", no, "possessive"},
      {"a++", no, "possessive"},
      {"a{2}+", no, "possessive quantifiers (a '+' after a quantifier) are not supported (at byte 4)"},
      {"a^b", no, "'^' is supported only as the first character of the pattern (at byte 1)"},
      {"(^a)", no, "'^'"},
      {"a$b", no, "'$' is supported only as the last character of the pattern (at byte 1)"},
      {"(a$)", no, "'$'"},
      {"\\p{L}", no, "Unicode property"},
      {"[[:alpha:]]", no, "POSIX classes"},
      {"(?>a)", no, "atomic groups"},
      {"(?#x)", no, "comments"},
      {"(?R)", no, "recursion"},
      {"\\01", no, "octal"},
      {"\\Aa", no, "anchors"},
  };
  for (const ErrorCase& c : cases) {
    auto r = ByteDfa::compile(c.pattern);
    ASSERT_FALSE(r.ok()) << "pattern \"" << c.pattern << "\" compiled";
    EXPECT_EQ(r.error().code, c.code) << c.pattern << ": " << r.error().message;
    EXPECT_NE(r.error().message.find(c.says), std::string::npos)
        << "pattern \"" << c.pattern << "\": message \"" << r.error().message << "\" lacks \"" << c.says << "\"";
  }
}

}  // namespace
}  // namespace lragent::guide
