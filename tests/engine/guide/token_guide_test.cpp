// TokenGuide over real vocabularies (tinystories-656k's SentencePiece-style BPE and Llama-3's
// byte-level BPE): the tokens it allows from a DFA state are exactly those whose bytes, walked
// one by one through the DFA, do not die (a brute-force walk of every token, not the trie), and
// the stop ids may end a step only at a whole match.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/guide/grammar.h"
#include "engine/guide/json_regex.h"
#include "engine/guide/token_guide.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent::guide {
namespace {

bool allowed_bit(const std::vector<uint64_t>& bits, int32_t id) { return bits[static_cast<size_t>(id) / 64] >> (id % 64) & 1; }

// Every token the brute-force walk allows from `state`, against the guide's set. `ref` is a
// second automaton of the same language (a ByteDfa or a GrammarDfa), walked byte by byte.
template <typename Automaton>
void expect_allowed_is_brute_force(TokenGuide& g, Automaton& ref, const VocabTrie& trie, const Tokenizer& tok,
                                   int32_t state, int32_t ref_state) {
  const std::vector<uint64_t> bits = g.allowed(state);
  int64_t n = 0;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    bool ok = !tok.is_special(id) && !tok.token_bytes(id).empty();
    int32_t s = ref_state;
    for (unsigned char c : tok.token_bytes(id)) {
      if (!ok) break;
      s = ref.next(s, c);
      ok = s != Automaton::kDead;
    }
    ASSERT_EQ(allowed_bit(bits, id), ok) << "token " << id << " '" << tok.token_bytes(id) << "'";
    n += ok;
  }
  EXPECT_EQ(trie.vocab_size(), tok.vocab_size());
  (void)n;
}

template <typename Automaton>
void random_walk(TokenGuide& g, Automaton& ref, const VocabTrie& trie, const Tokenizer& tok);

void check_vocabulary(const Tokenizer& tok) {
  auto trie = VocabTrie::build(tok);
  JsonRegexOptions o;
  o.max_depth = 2;
  const std::string schema_re = *json_schema_regex(nlohmann::json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"enum": ["red", "blue"]}}}, "required": ["name"]})"),
                                                   o);
  for (const std::string& re : {std::string("[0-9]{3}-[a-z]+"), std::string(" (?:yes|no)\\."), schema_re,
                                json_object_regex(o), std::string("[^a-z]*\xc3\xa9.")}) {
    SCOPED_TRACE(re);
    auto g = TokenGuide::compile(re, *trie);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto ref = ByteDfa::compile(re);  // a second DFA, walked byte by byte for the reference
    ASSERT_TRUE(ref.ok());
    random_walk(**g, **ref, *trie, tok);
  }
}

// States along a random walk of tokens the guide allowed: at each, its allowed set against the
// brute-force walk, and the two automata agree on whole matches.
template <typename Automaton>
void random_walk(TokenGuide& g, Automaton& ref, const VocabTrie& trie, const Tokenizer& tok) {
  std::mt19937 rng(7);
  int32_t s = g.start(), rs = ref.start();
  for (int step = 0; step < 6; ++step) {
    expect_allowed_is_brute_force(g, ref, trie, tok, s, rs);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<int32_t> ok;
    const std::vector<uint64_t>& bits = g.allowed(s);
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
      if (allowed_bit(bits, id)) ok.push_back(id);
    if (ok.empty()) break;
    const int32_t pick = ok[rng() % ok.size()];
    s = g.advance(s, pick);
    for (unsigned char c : tok.token_bytes(pick)) rs = ref.next(rs, c);
    ASSERT_NE(s, TokenGuide::kDead);
    EXPECT_EQ(g.accepting(s), ref.accepting(rs));
  }
}

// The same for grammars (grammar.h): JSON, and a little language no regex describes.
void check_vocabulary_grammars(const Tokenizer& tok) {
  auto trie = VocabTrie::build(tok);
  const char* kGrammars[] = {
      R"(root ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= "\"" [a-z_]+ "\"" ws ":" ws value ws
value ::= [0-9]+ | "\"" [^"\\]* "\"" | root | "[" ws (value ("," ws value)*)? "]"
ws ::= [ \n]?)",
      R"g(root ::= expr "="
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")" | " " term)g",
  };
  for (const char* gbnf : kGrammars) {
    SCOPED_TRACE(gbnf);
    auto g = TokenGuide::compile_grammar(gbnf, "root", *trie);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto grammar = Grammar::parse(gbnf);
    ASSERT_TRUE(grammar.ok());
    GrammarDfa ref(std::move(*grammar));
    random_walk(**g, ref, *trie, tok);
  }
}

TEST(TokenGuide, AllowsExactlyTheTokensWhoseBytesStayInTheLanguage) {
  auto tiny = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tiny.ok()) << tiny.error().message;
  check_vocabulary(**tiny);
}

TEST(TokenGuide, AllowsExactlyTheTokensWhoseBytesStayInTheLanguageLlama3) {
  const std::string dir = testing::fetched_fixtures_dir() + "/llama3";
  auto llama3 = Tokenizer::load_dir(dir);
  if (!llama3.ok()) GTEST_SKIP() << "no Llama-3 tokenizer at " << dir << " (scripts/fetch-fixtures.sh)";
  check_vocabulary(**llama3);
}

TEST(TokenGuide, GrammarsAllowExactlyTheTokensWhoseBytesStayInTheLanguage) {
  auto tiny = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tiny.ok()) << tiny.error().message;
  check_vocabulary_grammars(**tiny);
  const std::string dir = testing::fetched_fixtures_dir() + "/llama3";
  auto llama3 = Tokenizer::load_dir(dir);
  if (!llama3.ok()) GTEST_SKIP() << "no Llama-3 tokenizer at " << dir << " (scripts/fetch-fixtures.sh)";
  check_vocabulary_grammars(**llama3);
}

// The stop ids keep their logits exactly where the text is a whole match; everything outside the
// allowed set is -inf; a pattern whose next byte no token spells leaves nothing.
TEST(TokenGuide, MasksTheRowAndLetsStopIdsEndOnlyAWholeMatch) {
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok());
  auto trie = VocabTrie::build(**tok);
  auto g = TokenGuide::compile("ab|abc", *trie);
  ASSERT_TRUE(g.ok()) << g.error().message;
  const int32_t eos = (*tok)->eos_id();
  ASSERT_GE(eos, 0);
  const std::vector<int32_t> stops = {eos};
  const size_t vocab = static_cast<size_t>((*tok)->vocab_size());
  auto row = [&] { return std::vector<float>(vocab, 0.5f); };
  std::vector<float> r0 = row();
  const int64_t left0 = (*g)->mask((*g)->start(), r0, stops);
  EXPECT_GT(left0, 0);
  EXPECT_TRUE(std::isinf(r0[static_cast<size_t>(eos)]));  // nothing matched yet
  // After "ab" (whatever tokens spell it): a whole match, and "c" may follow.
  int32_t s = (*g)->start();
  for (int32_t id = 0; id < static_cast<int32_t>(vocab) && s == (*g)->start(); ++id)
    if ((*tok)->token_bytes(id) == "ab") s = (*g)->advance(s, id);
  if (s == (*g)->start()) {  // no "ab" token: "a" then "b"
    for (int32_t id = 0; id < static_cast<int32_t>(vocab); ++id)
      if ((*tok)->token_bytes(id) == "a") s = (*g)->advance(s, id);
    for (int32_t id = 0; id < static_cast<int32_t>(vocab); ++id)
      if ((*tok)->token_bytes(id) == "b") s = (*g)->advance(s, id);
  }
  ASSERT_NE(s, TokenGuide::kDead);
  ASSERT_TRUE((*g)->accepting(s));
  EXPECT_TRUE((*g)->can_continue(s));
  std::vector<float> r1 = row();
  r1[static_cast<size_t>(eos)] = 2.f;
  (*g)->mask(s, r1, stops);
  EXPECT_EQ(r1[static_cast<size_t>(eos)], 2.f);
  for (size_t id = 0; id < vocab; ++id)
    if (static_cast<int32_t>(id) != eos && !std::isinf(r1[id])) EXPECT_EQ((*tok)->token_bytes(static_cast<int32_t>(id)), "c");
  // Text no token can spell (a control byte tinystories' vocabulary lacks, say) leaves nothing.
  auto none = TokenGuide::compile("\\x01\\x02\\x03", *trie);
  ASSERT_TRUE(none.ok());
  std::vector<float> r2 = row();
  bool spellable = false;
  for (int32_t id = 0; id < static_cast<int32_t>(vocab); ++id)
    spellable = spellable || (!(*tok)->is_special(id) && (*tok)->token_bytes(id).rfind('\x01', 0) == 0);
  if (!spellable) EXPECT_EQ((*none)->mask((*none)->start(), r2, stops), 0);
  // A pattern matching nothing is refused.
  EXPECT_FALSE(TokenGuide::compile("[^\\x00-\\u{10FFFF}]", *trie).ok());
}

// A grammar whose parses double with each letter: the mask's walk of the longest words passes
// the automaton's ambiguity bound, which cuts those tokens only; the short words the text is
// made of stay allowed, and the guide goes on to a whole match.
TEST(TokenGuide, ATokenPastTheAmbiguityBoundIsCutAlone) {
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok());
  auto trie = VocabTrie::build(**tok);
  auto g = TokenGuide::compile_grammar(R"(root ::= [ a-z] root "x" | [ a-z] root "y" | ".")", "root", *trie);
  ASSERT_TRUE(g.ok()) << g.error().message;
  const size_t vocab = static_cast<size_t>((*tok)->vocab_size());
  int32_t longest = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(vocab); ++id) {
    const std::string& b = (*tok)->token_bytes(id);
    if (!(*tok)->is_special(id) && b.find_first_not_of(" abcdefghijklmnopqrstuvwxyz") == std::string::npos &&
        b.size() > (*tok)->token_bytes(longest).size())
      longest = id;
  }
  ASSERT_GE((*tok)->token_bytes(longest).size(), 13u) << "no word long enough to pass 2^12 parses";
  const std::vector<uint64_t> first = (*g)->allowed((*g)->start());
  EXPECT_FALSE(first[static_cast<size_t>(longest) / 64] >> (longest % 64) & 1);
  EXPECT_NE((*g)->dead_end().find("too ambiguous"), std::string::npos) << (*g)->dead_end();
  // " the" then "." then one closing letter per opened one: a whole match.
  int32_t s = (*g)->start();
  for (const char* piece : {" the", "."}) {
    auto ids = (*tok)->encode(piece, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) {
      const std::vector<uint64_t>& bits = (*g)->allowed(s);
      ASSERT_TRUE(bits[static_cast<size_t>(id) / 64] >> (id % 64) & 1) << piece << ": token " << id;
      s = (*g)->advance(s, id);
      ASSERT_NE(s, TokenGuide::kDead) << piece;
    }
  }
  int32_t x = -1;
  for (int32_t id = 0; id < static_cast<int32_t>(vocab) && x < 0; ++id)
    if (!(*tok)->is_special(id) && (*tok)->token_bytes(id) == "x") x = id;
  ASSERT_GE(x, 0);
  for (int n = 0; n < 8 && !(*g)->accepting(s); ++n) s = (*g)->advance(s, x);
  EXPECT_TRUE((*g)->accepting(s));
}

}  // namespace
}  // namespace lragent::guide
