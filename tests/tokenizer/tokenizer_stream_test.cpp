// StreamDecoder: for any id sequence, the pushes plus finish() concatenate to decode(ids), and
// no push returns a partial UTF-8 character. Checked on random ids (biased towards byte pieces
// and multi-byte characters) for every tokenizer family.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "encode_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace lragent {
namespace {

using testing::must_encode;

using nlohmann::json;

// Pushes `ids` one by one; checks every piece and the total against decode().
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder sd(tok);
  std::string all;
  for (const int32_t id : ids) {
    const std::string piece = sd.push(id);
    ASSERT_TRUE(unicode::is_valid_utf8(piece)) << "push(" << id << ") returned a partial character";
    all += piece;
  }
  const std::string rest = sd.finish();
  ASSERT_TRUE(unicode::is_valid_utf8(rest));
  all += rest;
  ASSERT_EQ(all, tok.decode(ids)) << "ids: " << json(ids).dump();
}

// Random sequences; half of the ids come from `favoured` (byte pieces, pieces of multi-byte
// characters, special tokens), so that incomplete characters are common.
void check_random_streams(const Tokenizer& tok, const std::vector<int32_t>& favoured, int rounds) {
  std::mt19937 rng(1234);
  for (int r = 0; r < rounds; ++r) {
    std::vector<int32_t> ids(1 + rng() % 24);
    for (int32_t& id : ids) {
      id = (!favoured.empty() && rng() % 2) ? favoured[rng() % favoured.size()]
                                            : static_cast<int32_t>(rng() % tok.vocab_size());
    }
    check_stream(tok, ids);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Ids whose pieces are not whole characters: every token of the texts' encodings.
std::vector<int32_t> pieces_of(const Tokenizer& tok, const std::vector<std::string>& texts) {
  std::vector<int32_t> out;
  for (const auto& t : texts) {
    const auto ids = must_encode(tok, t, false);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

const std::vector<std::string> kMultibyte = {"日本語のテキスト", "👨‍👩‍👧‍👦 🇺🇸 😀",
                                             "café naïve", "한국어", "\xEF\xBF\xBD"};

TEST(TokenizerStream, TinyStories) {
  auto tok = Tokenizer::load_dir(testing::tinystories_dir());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  check_random_streams(*tok.value(), {0, 1, 2, 80}, 400);
  check_stream(*tok.value(), must_encode(*tok.value(), "Once upon a time, there was a  cat.\n\nThe end."));
}

TEST(TokenizerStream, Llama3AndQwen3) {
  for (const std::string name : {"llama3", "qwen3"}) {
    const std::string dir = testing::fetched_fixtures_dir() + "/" + name;
    if (!std::filesystem::exists(dir + "/tokenizer.json")) LRAGENT_SKIP_UNLESS_REQUIRED(dir << ": run scripts/fetch-fixtures.sh");
    auto tok = Tokenizer::load_dir(dir);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    check_random_streams(*tok.value(), pieces_of(*tok.value(), kMultibyte), 400);
  }
}

TEST(TokenizerStream, ByteFallbackRuns) {
  // Llama-2 style: byte pieces <0x00>..<0xFF> (ids 1..256) and SentencePiece decoding.
  json vocab = {{"<unk>", 0}, {"\u2581", 257}, {"a", 258}, {"\u2581a", 259}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 1 + b;
  const json j = {
      {"pre_tokenizer",
       {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"vocab", vocab}, {"merges", {"\u2581 a"}}}}};
  auto tok = Tokenizer::from_json(j.dump(), "", "test/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // "中" = E4 B8 AD; 0x80 alone is invalid, and makes a whole preceding run invalid.
  const std::vector<int32_t> favoured = {1 + 0xE4, 1 + 0xB8, 1 + 0xAD, 1 + 0x80, 1 + 0x20, 257, 258, 259};
  check_random_streams(*tok.value(), favoured, 2000);
  // Text arrives as soon as it is final: the run ends when "a" comes.
  StreamDecoder sd(*tok.value());
  EXPECT_EQ(sd.push(259), "a");
  EXPECT_EQ(sd.push(1 + 0xE4), "");
  EXPECT_EQ(sd.push(1 + 0xB8), "");
  EXPECT_EQ(sd.push(1 + 0xAD), "");
  EXPECT_EQ(sd.push(259), "\u4e2d a");
  EXPECT_EQ(sd.finish(), "");
}

TEST(TokenizerStream, EmitsIncrementally) {
  const std::string dir = testing::fetched_fixtures_dir() + "/llama3";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) LRAGENT_SKIP_UNLESS_REQUIRED(dir << ": run scripts/fetch-fixtures.sh");
  auto tok = Tokenizer::load_dir(dir);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const std::string text = "Streaming 日本語 text 👍🏽 arrives piece by piece.";
  const auto ids = must_encode(*tok.value(), text);
  StreamDecoder sd(*tok.value());
  std::string so_far;
  int partial_steps = 0;  // pushes that ended inside a multi-byte character
  for (size_t i = 0; i < ids.size(); ++i) {
    so_far += sd.push(ids[i]);
    // After each push, everything the ids so far decode to as whole characters is out: decode()
    // of the prefix, less the U+FFFD it writes for a character whose bytes are still to come.
    std::string whole = tok.value()->decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(i) + 1));
    const std::string fffd = "\xEF\xBF\xBD";
    bool cut = false;
    while (whole.size() >= fffd.size() && whole.compare(whole.size() - fffd.size(), fffd.size(), fffd) == 0) {
      whole.resize(whole.size() - fffd.size());
      cut = true;
    }
    partial_steps += cut;
    ASSERT_EQ(so_far, whole) << "after push " << i;
  }
  EXPECT_GT(partial_steps, 0) << "the text should make some pushes end inside a character";
  // Only a held-back tail may remain for finish(); here the text ends with a whole character.
  EXPECT_EQ(so_far, text);
  EXPECT_EQ(sd.finish(), "");
}

}  // namespace
}  // namespace lragent
