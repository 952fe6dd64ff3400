// HF pipeline behaviours checked on small hand-written tokenizer.json files, plus the Unicode
// helpers they rely on. Expected values follow HF `tokenizers` semantics (noted per test).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "encode_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace lragent {
namespace {

using testing::must_encode;

using nlohmann::json;

std::unique_ptr<Tokenizer> load(const json& tokenizer, const json& config = json()) {
  auto r = Tokenizer::from_json(tokenizer.dump(), config.is_null() ? "" : config.dump(), "test/tokenizer.json");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : nullptr;
}

json added(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// Llama-2 style: Metaspace pre-tokenizer, byte fallback, <s> template, SentencePiece decoder.
// ids: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, then the pieces below.
json sentencepiece_tokenizer(const std::string& prepend_scheme = "first", bool split = false) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  const std::vector<std::string> pieces = {"\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "c"};
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = 259 + static_cast<int>(i);
  return {
      {"added_tokens", {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", prepend_scheme}, {"split", split}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", {"\u2581 a", "a b", "\u2581a b"}}}},
  };
}
constexpr int32_t kSpace = 259, kA = 260, kB = 261, kSpaceA = 262, kAB = 263, kSpaceAB = 264;
int32_t byte_id(uint8_t b) { return 3 + b; }

TEST(TokenizerSentencePiece, MergesAndTemplate) {
  auto tok = load(sentencepiece_tokenizer());
  ASSERT_TRUE(tok);
  // "▁ab": "▁ a" (rank 0) first, then "▁a b" (rank 2).
  EXPECT_EQ(must_encode(*tok, "ab"), (std::vector<int32_t>{1, kSpaceAB}));
  EXPECT_EQ(must_encode(*tok, "ab", false), (std::vector<int32_t>{kSpaceAB}));
  EXPECT_EQ(must_encode(*tok, ""), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok->decode({1, kSpaceAB, kSpaceA}), "<s> ab a");
  EXPECT_EQ(tok->decode({kSpaceAB, kSpaceA}), "ab a");  // Strip takes the leading space
  EXPECT_EQ(tok->token_bytes(kSpaceAB), " ab");
  EXPECT_EQ(tok->vocab_size(), 266);
}

TEST(TokenizerSentencePiece, ByteFallbackEncode) {
  auto tok = load(sentencepiece_tokenizer());
  ASSERT_TRUE(tok);
  // U+4E2D is not in the vocab: its UTF-8 bytes E4 B8 AD become <0xE4> <0xB8> <0xAD>.
  EXPECT_EQ(must_encode(*tok, "\u4e2d", false), (std::vector<int32_t>{kSpace, byte_id(0xE4), byte_id(0xB8), byte_id(0xAD)}));
  EXPECT_EQ(tok->token_bytes(byte_id(0xE4)), "\xE4");
}

TEST(TokenizerSentencePiece, ByteFallbackDecodeIsPerByteWhenInvalid) {
  auto tok = load(sentencepiece_tokenizer());
  ASSERT_TRUE(tok);
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(tok->decode({byte_id(0xE4), byte_id(0xB8), byte_id(0xAD)}), "\u4e2d");
  // HF's ByteFallback gives one U+FFFD per byte of an invalid run, not one per bad sequence.
  EXPECT_EQ(tok->decode({kA, byte_id(0xE4), byte_id(0xB8)}), "a" + fffd + fffd);
  EXPECT_EQ(tok->decode({byte_id(0xE4), byte_id(0xB8), byte_id(0xAD), byte_id(0x80), kB}),
            fffd + fffd + fffd + fffd + "b");
}

TEST(TokenizerSentencePiece, PrependSchemeFirstSkipsTextAfterSpecialToken) {
  auto first = load(sentencepiece_tokenizer("first"));
  auto always = load(sentencepiece_tokenizer("always"));
  auto never = load(sentencepiece_tokenizer("never"));
  ASSERT_TRUE(first && always && never);
  // "<s>ab": the piece "ab" does not start the input, so "first" adds no "▁" to it.
  EXPECT_EQ(must_encode(*first, "<s>ab", false), (std::vector<int32_t>{1, kAB}));
  EXPECT_EQ(must_encode(*always, "<s>ab", false), (std::vector<int32_t>{1, kSpaceAB}));
  EXPECT_EQ(must_encode(*never, "ab", false), (std::vector<int32_t>{kAB}));
  EXPECT_EQ(must_encode(*first, " ab", false), (std::vector<int32_t>{kSpaceAB}));  // already starts with "▁"
}

TEST(TokenizerSentencePiece, MetaspaceSplit) {
  auto split = load(sentencepiece_tokenizer("always", true));
  auto whole = load(sentencepiece_tokenizer("always", false));
  ASSERT_TRUE(split && whole);
  EXPECT_EQ(must_encode(*split, "ab ab", false), (std::vector<int32_t>{kSpaceAB, kSpaceAB}));
  // Unsplit, "▁ab▁ab" merges "▁ a" at both places first, then "▁a b" at both.
  EXPECT_EQ(must_encode(*whole, "ab ab", false), (std::vector<int32_t>{kSpaceAB, kSpaceAB}));
  EXPECT_EQ(must_encode(*split, "a  b", false), (std::vector<int32_t>{kSpaceA, kSpace, kSpace, kB}));
}

TEST(TokenizerSentencePiece, UnknownCharsFuseIntoOneUnk) {
  json j = sentencepiece_tokenizer();
  j["model"]["byte_fallback"] = false;
  auto tok = load(j);
  ASSERT_TRUE(tok);
  EXPECT_EQ(must_encode(*tok, "a\u4e2d\u4e2db", false), (std::vector<int32_t>{kSpaceA, 0, kB}));
  j["model"]["fuse_unk"] = false;
  auto unfused = load(j);
  ASSERT_TRUE(unfused);
  EXPECT_EQ(must_encode(*unfused, "a\u4e2d\u4e2db", false), (std::vector<int32_t>{kSpaceA, 0, 0, kB}));
}

TEST(TokenizerSentencePiece, MetaspaceDecoderDropsEveryReplacementOfFirstToken) {
  json j = sentencepiece_tokenizer();
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  j["decoder"]["prepend_scheme"] = "never";
  auto never = load(j);
  ASSERT_TRUE(never);
  EXPECT_EQ(tok->decode({kSpace, kSpace, kSpaceA}), "  a");
  EXPECT_EQ(tok->decode({kSpaceA, kSpaceAB}), "a ab");
  EXPECT_EQ(never->decode({kSpaceA, kSpaceAB}), " a ab");
}

// A character-level vocab over "abc-" plus the merged pieces, for pre-tokenizer tests.
json char_tokenizer(const json& pre_tokenizer) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"-", 3}, {"a-", 4}, {"-b", 5}, {"--", 6}, {"-c", 7}, {"b-", 8}};
  return {{"pre_tokenizer", pre_tokenizer},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", json::array({json::array({"a", "-"}), json::array({"-", "b"}), json::array({"-", "-"}),
                                    json::array({"-", "c"}), json::array({"b", "-"})})}}}};
}

TEST(TokenizerPreTokenizer, SplitBehaviors) {
  auto split = [](const std::string& behavior, bool invert = false) {
    return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
  };
  const std::string text = "a-b--c";
  using V = std::vector<int32_t>;
  // Without a pre-tokenizer all merges apply by rank: a- (0), then -- (2); "b -" comes too late.
  EXPECT_EQ(must_encode(*load(char_tokenizer(nullptr)), text), (V{4, 1, 6, 2}));
  EXPECT_EQ(must_encode(*load(char_tokenizer(split("Isolated"))), text), (V{0, 3, 1, 3, 3, 2}));
  EXPECT_EQ(must_encode(*load(char_tokenizer(split("Removed"))), text), (V{0, 1, 2}));
  EXPECT_EQ(must_encode(*load(char_tokenizer(split("MergedWithPrevious"))), text), (V{4, 8, 3, 2}));
  EXPECT_EQ(must_encode(*load(char_tokenizer(split("MergedWithNext"))), text), (V{0, 5, 3, 7}));
  EXPECT_EQ(must_encode(*load(char_tokenizer(split("Contiguous"))), text), (V{0, 3, 1, 6, 2}));
  EXPECT_EQ(must_encode(*load(char_tokenizer(split("Removed", true))), text), (V{3, 3, 3}));
}

TEST(TokenizerPreTokenizer, RegexWhitespaceIsUnicodeWhiteSpace) {
  // Oniguruma's \s is Unicode White_Space: NEL (U+0085) is one, U+180E is not (PCRE2's \s
  // says the opposite for U+180E, which the pattern translation corrects).
  const json vocab = {{"a", 0}, {"b", 1}, {"\u180e", 2}, {"\u0085", 3}};
  const json j = {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}}},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  EXPECT_EQ(must_encode(*tok, "a\u0085b"), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(must_encode(*tok, "a\u180eb"), (std::vector<int32_t>{0, 2, 1}));
}

TEST(TokenizerPreTokenizer, RegexThatGivesUpIsAnErrorNotOnePiece) {
  // (a+)+$ backtracks exponentially on a run of a's that does not end the text: PCRE2 hits its
  // match limit, with and without the JIT. The text after that point used to stay one unsplit
  // piece, whose ids differ from HF's without a word; now encode fails and names the pattern.
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}};
  const std::string catastrophic = "(a+)+$";
  const json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  const json split = {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", catastrophic}}}, {"behavior", "Isolated"}}},
                      {"model", model}};
  const json replace = {{"normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", catastrophic}}}, {"content", "b"}}},
                        {"model", model}};
  const std::string pathological = std::string(40, 'a') + "b";
  for (const json& j : {split, replace}) {
    auto tok = load(j);
    ASSERT_TRUE(tok);
    EXPECT_EQ(must_encode(*tok, "aacb"), (std::vector<int32_t>{0, 0, 2, 1})) << j.dump();  // short text: fine
    auto ids = tok->encode("b" + pathological);
    ASSERT_FALSE(ids.ok()) << j.dump();
    EXPECT_EQ(ids.error().code, ErrorCode::kInvalidArgument);
    const std::string& msg = ids.error().message;
    EXPECT_NE(msg.find("test/tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Regex"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gave up on this text, searching from byte 0 of a 42-byte piece"), std::string::npos) << msg;
  }
}

// Oniguruma (HF's regex engine) differences the pattern translation and the match loop follow:
// nested character classes are unions (BLOOM's real pre-tokenizer uses one); ^ and $ anchor
// each line; an empty match where the previous match ended is skipped (rust-onig's
// FindMatches). Negated nested classes and && intersections are refused, not misread.
TEST(TokenizerPreTokenizer, OnigurumaRegexSemantics) {
  const json vocab = {{"a", 0}, {"b", 1}, {" ", 2}, {".", 3}, {"\n", 4}, {"X", 5}, {"_", 6}, {"(", 7}};
  const json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  auto with = [&](const json& extra) {
    json j = extra;
    j["model"] = model;
    return j;
  };
  using V = std::vector<int32_t>;
  // BLOOM: " ?[^(\s|[.,!?…。，、।۔،])]+" isolates runs of anything but whitespace, '(', '|', ')'
  // and the listed punctuation (PCRE2 alone fails to compile it).
  const json bloom = with({{"pre_tokenizer", {{"type", "Split"},
                                              {"pattern", {{"Regex", " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"}}},
                                              {"behavior", "Isolated"}}}});
  auto tok = load(bloom);
  ASSERT_TRUE(tok);
  EXPECT_EQ(must_encode(*tok, "ab. (a"), (V{0, 1, 3, 2, 7, 0}));
  // ^ after a newline (Oniguruma's line anchor): both lines' "a" are replaced.
  auto caret = load(with({{"normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", "^a"}}}, {"content", "X"}}}}));
  ASSERT_TRUE(caret);
  EXPECT_EQ(must_encode(*caret, "ab\nab"), (V{5, 1, 4, 5, 1}));
  auto dollar = load(with({{"normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", "b$"}}}, {"content", "X"}}}}));
  ASSERT_TRUE(dollar);
  EXPECT_EQ(must_encode(*dollar, "ab\nab"), (V{0, 5, 4, 0, 5}));
  // " *" matches " " then, where it ended, the empty string: skipped, so one "_" per gap.
  auto empty = load(with({{"normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", " *"}}}, {"content", "_"}}}}));
  ASSERT_TRUE(empty);
  EXPECT_EQ(must_encode(*empty, "a b"), (V{6, 0, 6, 1, 6}));
  for (const char* pattern : {"[a[^b]]", "[a-z&&[^b]]"}) {
    auto r = Tokenizer::from_json(
        with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}}}})
            .dump(),
        "", "test/tokenizer.json");
    ASSERT_FALSE(r.ok()) << pattern;
    EXPECT_EQ(r.error().code, ErrorCode::kUnsupported) << r.error().message;
  }
  // POSIX classes inside a class are copied as they are.
  auto posix = load(with({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "[[:alpha:].]+"}}},
                                             {"behavior", "Removed"}}}}));
  ASSERT_TRUE(posix);
  EXPECT_EQ(must_encode(*posix, "ab. a"), (V{2}));
}

TEST(TokenizerPreTokenizer, ByteLevelWithGpt2RegexAndPrefixSpace) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(s, unicode::byte_to_char(static_cast<uint8_t>(b)));
    vocab[s] = b;
  }
  vocab["\u0120hi"] = 256;  // "Ġhi"
  vocab["\u0120h"] = 257;
  const json j = {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
                  {"decoder", {{"type", "ByteLevel"}}},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\u0120 h", "\u0120h i"}}}}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  // " hi" and "!" are separate GPT-2 pieces, so "Ġhi" forms but does not take the "!".
  EXPECT_EQ(must_encode(*tok, "hi!"), (std::vector<int32_t>{256, '!'}));
  EXPECT_EQ(tok->decode({256, '!'}), " hi!");
  EXPECT_EQ(tok->decode({0xE4, 0xB8}), "\xEF\xBF\xBD");  // one U+FFFD, as from_utf8_lossy
}

TEST(TokenizerBpe, IgnoreMergesEmitsVocabWordsWhole) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"abc", 4}, {"ab", 5}};
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"b c", "a b"}}}}};
  // "b c" outranks "a b", and no merge joins "a" with "bc".
  EXPECT_EQ(must_encode(*load(j), "abc"), (std::vector<int32_t>{0, 3}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(must_encode(*load(j), "abc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(must_encode(*load(j), "abcc"), (std::vector<int32_t>{0, 3, 2}));
}

TEST(TokenizerAddedTokens, StripAndSingleWord) {
  const json vocab = {{"a", 0}, {"b", 1}, {" ", 2}, {"x", 3}};
  auto token = [](int id, const std::string& content, bool lstrip, bool rstrip, bool single_word) {
    return json{{"id", id},         {"content", content},         {"lstrip", lstrip},
                {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", false},
                {"special", true}};
  };
  const json j = {{"added_tokens",
                   {token(10, "<m>", true, false, false), token(11, "<r>", false, true, false),
                    token(12, "ab", false, false, true)}},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  using V = std::vector<int32_t>;
  EXPECT_EQ(must_encode(*tok, "a  <m> b"), (V{0, 10, 2, 1}));  // lstrip takes both spaces before
  EXPECT_EQ(must_encode(*tok, "a <r>  b"), (V{0, 2, 11, 1}));  // rstrip takes both spaces after
  EXPECT_EQ(must_encode(*tok, "ab a"), (V{12, 2, 0}));         // a whole word
  EXPECT_EQ(must_encode(*tok, "xab"), (V{3, 0, 1}));           // inside a word: not matched
  // Rust regex's \w (HF's word test) includes Other_Alphabetic: a circled letter is a word char.
  EXPECT_EQ(must_encode(*tok, "\u24b6ab").back(), 1) << "ab after \u24b6 is inside a word";
  EXPECT_EQ(tok->token_to_id("<m>"), 10);
  EXPECT_EQ(tok->id_to_token(11), "<r>");
  EXPECT_EQ(tok->decode({0, 10, 1}), "a <m> b");  // no decoder: tokens joined with spaces
}

TEST(TokenizerAddedTokens, LongestMatchWins) {
  const json vocab = {{"a", 0}};
  const json j = {{"added_tokens", {added(5, "<|x"), added(6, "<|x|>"), added(7, "|>")}},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  auto tok = load(j);
  ASSERT_TRUE(tok);
  EXPECT_EQ(must_encode(*tok, "a<|x|>a<|xa"), (std::vector<int32_t>{0, 6, 0, 5, 0}));
}

TEST(TokenizerConfig, FlagsRebuildTheTemplate) {
  const json j = sentencepiece_tokenizer();
  // As transformers does: add_bos_token / add_eos_token decide, whatever the post-processor.
  auto eos_only = load(
      j,
      {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}, {"add_bos_token", false}, {"add_eos_token", true}});
  ASSERT_TRUE(eos_only);
  EXPECT_EQ(must_encode(*eos_only, "ab"), (std::vector<int32_t>{kSpaceAB, 2}));
  EXPECT_EQ(eos_only->bos_id(), 1);
  EXPECT_EQ(eos_only->eos_id(), 2);
  json no_post = j;
  no_post["post_processor"] = nullptr;
  auto bos = load(no_post, {{"bos_token", "<s>"}, {"add_bos_token", true}});
  ASSERT_TRUE(bos);
  EXPECT_EQ(must_encode(*bos, "ab"), (std::vector<int32_t>{1, kSpaceAB}));
  EXPECT_EQ(must_encode(*load(no_post), "ab"), (std::vector<int32_t>{kSpaceAB}));
}

TEST(TokenizerUnicode, FromUtf8LossyMatchesRust) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::from_utf8_lossy("ok \xE4\xB8\xAD"), "ok \u4e2d");
  EXPECT_EQ(unicode::from_utf8_lossy("\xE4\xB8"), fffd);  // truncated: one
  EXPECT_EQ(unicode::from_utf8_lossy("\xE4\xB8"
                                     "a"),
            fffd + "a");
  EXPECT_EQ(unicode::from_utf8_lossy("\xF0\x9F\x98"), fffd);
  EXPECT_EQ(unicode::from_utf8_lossy("\xC0\x80"), fffd + fffd);                        // overlong lead
  EXPECT_EQ(unicode::from_utf8_lossy("\xED\xA0\x80"), fffd + fffd + fffd);             // surrogate
  EXPECT_EQ(unicode::from_utf8_lossy("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // > U+10FFFF
  EXPECT_EQ(unicode::from_utf8_lossy("\x80\xBF"), fffd + fffd);
  EXPECT_FALSE(unicode::is_valid_utf8("\xE4\xB8"));
  EXPECT_TRUE(unicode::is_valid_utf8("\xF0\x9F\x98\x80"));
}

TEST(TokenizerUnicode, Nfc) {
  EXPECT_EQ(unicode::nfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");   // Hangul L V T
  EXPECT_EQ(unicode::nfc("\u1e0b\u0323"), "\u1e0d\u0307");   // reordered, then composed
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");               // singleton (Angstrom sign)
  EXPECT_EQ(unicode::nfc("\u0958"), "\u0915\u093c");         // composition exclusion
  EXPECT_EQ(unicode::nfc("a\u0301\u0301"), "\u00e1\u0301");  // second mark is blocked
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
}

}  // namespace
}  // namespace lragent
