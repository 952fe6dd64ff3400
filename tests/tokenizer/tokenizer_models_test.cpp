// The real tokenizers: TinyStories (shared/models) with expectations checked by hand against its
// vocab and merges, and Llama-3 / Qwen3 (.fixtures, from scripts/fetch-fixtures.sh) around
// special tokens inside text.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "encode_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

using testing::must_encode;

using V = std::vector<int32_t>;

std::unique_ptr<Tokenizer> load_fetched(const std::string& name) {
  auto r = Tokenizer::load_dir(testing::fetched_fixtures_dir() + "/" + name);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : nullptr;
}

bool have_fetched(const std::string& name) {
  return std::filesystem::exists(testing::fetched_fixtures_dir() + "/" + name + "/tokenizer.json");
}

std::unique_ptr<Tokenizer> load_tinystories(TokenizerFlavor flavor) {
  auto r = Tokenizer::load_dir(testing::tinystories_dir(), flavor);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(TokenizerTinyStories, HandCheckedIds) {
  auto lib = load_tinystories(TokenizerFlavor::kTokenizers);
  auto tf = load_tinystories(TokenizerFlavor::kTransformers);
  ASSERT_TRUE(lib && tf);
  for (const Tokenizer* tok : {lib.get(), tf.get()}) {
    EXPECT_EQ(tok->vocab_size(), 2048);
    EXPECT_EQ(tok->bos_id(), 1);  // <|start_story|>, added because add_bos_token is true
    EXPECT_EQ(tok->eos_id(), 2);  // <|end_story|>
    // "▁1234567": digits have no merges, "▁" is 80, "1".."7" are 12..18.
    EXPECT_EQ(must_encode(*tok, "1234567"), (V{1, 80, 12, 13, 14, 15, 16, 17, 18}));
    EXPECT_EQ(must_encode(*tok, ""), (V{1}));
    EXPECT_EQ(must_encode(*tok, "a", false), (V{85}));  // merge #4 "▁ a" gives "▁a" (85)
    // Decoding: "▁" -> " ", and Strip removes one leading space of the whole text.
    EXPECT_EQ(tok->decode({85, 0, 54}), "a<unk>b");
    EXPECT_EQ(tok->decode({1, 85, 0, 54}), "<|start_story|> a<unk>b");
    EXPECT_EQ(tok->token_bytes(85), " a");
    EXPECT_EQ(tok->id_to_token(85), "\u2581a");
    EXPECT_EQ(tok->token_to_id("\u2581a"), 85);
    EXPECT_EQ(tok->token_to_id("no such token"), -1);
    EXPECT_EQ(tok->id_to_token(99999), "");
  }
  // The tab is not in the vocab and there are no byte pieces. tokenizer.json names <unk> (0),
  // and fuse_unk makes a run of unknown characters one <unk>; transformers 5 builds its BPE
  // without an unk token, so the tab disappears.
  EXPECT_EQ(must_encode(*lib, "a\tb"), (V{1, 85, 0, 54}));
  EXPECT_EQ(must_encode(*lib, "a\t\t\tb"), (V{1, 85, 0, 54}));
  EXPECT_EQ(must_encode(*tf, "a\t\t\tb"), must_encode(*tf, "ab"));
  // tokenizer.json's normalizer prepends "▁" even before a leading space; transformers'
  // Metaspace only replaces the space.
  EXPECT_EQ(must_encode(*lib, " a", false), (V{80, 85}));
  EXPECT_EQ(must_encode(*tf, " a", false), (V{85}));
}

// The model goldens' prompts were tokenized by transformers 5 AutoTokenizer, and by the
// tokenizers library where it disagreed (prompt_tokens_tokenizers_lib).
TEST(TokenizerTinyStories, MatchesModelGoldenPrompts) {
  const std::string path = testing::fixtures_dir() + "/goldens/tinystories-base.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (a committed golden)";
  const auto golden = nlohmann::json::parse(testing::read_file(path));
  auto lib = load_tinystories(TokenizerFlavor::kTokenizers);
  auto tf = load_tinystories(TokenizerFlavor::kTransformers);
  ASSERT_TRUE(lib && tf);
  for (const auto& c : golden["cases"]) {
    const std::string prompt = c["prompt"];
    const auto want = c["prompt_tokens"].get<V>();
    EXPECT_EQ(must_encode(*tf, prompt), want) << prompt;
    EXPECT_EQ(must_encode(*lib, prompt), c.value("prompt_tokens_tokenizers_lib", want)) << prompt;
    EXPECT_EQ(tf->decode(c["output_tokens"].get<V>()), c["text"].get<std::string>()) << prompt;
  }
}

TEST(TokenizerTinyStories, NormalizedSpecialTokens) {
  auto lib = load_tinystories(TokenizerFlavor::kTokenizers);
  auto tf = load_tinystories(TokenizerFlavor::kTransformers);
  ASSERT_TRUE(lib && tf);
  // Its added tokens are normalized: the tokenizers library matches "▁<|start_story|>" in the
  // normalized text, so the token is found at the start or after a space, but not glued to a
  // previous word. transformers 5 has no normalizer and finds it anywhere.
  EXPECT_EQ(must_encode(*lib, "<|start_story|>a", false), (V{1, 53}));
  EXPECT_EQ(must_encode(*lib, "x <|end_story|>", false), (V{80, 76, 2}));
  const V glued = must_encode(*lib, "x<|end_story|>", false);
  EXPECT_EQ(std::count(glued.begin(), glued.end(), 2), 0);
  EXPECT_EQ(must_encode(*tf, "x<|end_story|>", false).back(), 2);
  EXPECT_EQ(must_encode(*tf, "<|start_story|>a", false), (V{1, 53}));
}

TEST(TokenizerLlama3, SpecialTokensInsideText) {
  if (!have_fetched("llama3")) LRAGENT_SKIP_UNLESS_REQUIRED("run scripts/fetch-fixtures.sh");
  auto tok = load_fetched("llama3");
  ASSERT_TRUE(tok);
  const int32_t bot = tok->token_to_id("<|begin_of_text|>");
  const int32_t eot = tok->token_to_id("<|eot_id|>");
  EXPECT_EQ(bot, 128000);
  EXPECT_EQ(eot, 128009);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->vocab_size(), 128256);
  // Special tokens split the text; the pieces in between encode as on their own.
  const V hello = must_encode(*tok, "Hello, world", false);
  const V bye = must_encode(*tok, " bye", false);
  V want = {bot};
  want.insert(want.end(), hello.begin(), hello.end());
  want.push_back(eot);
  want.insert(want.end(), bye.begin(), bye.end());
  EXPECT_EQ(must_encode(*tok, "<|begin_of_text|>Hello, world<|eot_id|> bye"), want);
  EXPECT_EQ(tok->decode(want), "<|begin_of_text|>Hello, world<|eot_id|> bye");
  // This tokenizer.json has only a ByteLevel post-processor: HF adds no BOS.
  EXPECT_EQ(must_encode(*tok, "Hello, world"), hello);
  EXPECT_EQ(hello, (V{9906, 11, 1917}));
  // A near miss is ordinary text.
  EXPECT_EQ(std::count(hello.begin(), hello.end(), eot), 0);
  const V near = must_encode(*tok, "<|eot_id>");
  EXPECT_EQ(std::count(near.begin(), near.end(), eot), 0);
}

TEST(TokenizerLlama3, LongRunsRoundTrip) {
  if (!have_fetched("llama3")) LRAGENT_SKIP_UNLESS_REQUIRED("run scripts/fetch-fixtures.sh");
  auto tok = load_fetched("llama3");
  ASSERT_TRUE(tok);
  // Byte-level BPE loses nothing: decode(encode(x)) == x for any valid UTF-8, however long the
  // runs the pre-tokenizer regex has to cross.
  for (const std::string& text : {std::string(20000, 'a'), std::string(20000, ' ') + "x", std::string(5000, '\n'),
                                   "x" + std::string(20000, '\t') + "y", std::string(9000, '7'),
                                   std::string(3000, '!') + " ok"}) {
    EXPECT_EQ(tok->decode(must_encode(*tok, text)), text) << text.substr(0, 20) << "... (" << text.size() << " bytes)";
  }
}

TEST(TokenizerQwen3, SpecialTokensAndNfc) {
  if (!have_fetched("qwen3")) LRAGENT_SKIP_UNLESS_REQUIRED("run scripts/fetch-fixtures.sh");
  auto tok = load_fetched("qwen3");
  ASSERT_TRUE(tok);
  const int32_t im_start = tok->token_to_id("<|im_start|>");
  const int32_t im_end = tok->token_to_id("<|im_end|>");
  EXPECT_EQ(im_start, 151644);
  EXPECT_EQ(im_end, 151645);
  EXPECT_EQ(tok->bos_id(), -1);  // bos_token is null
  const V ids = must_encode(*tok, "<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids.back(), im_end);
  // The NFC normalizer makes decomposed and composed accents the same text.
  EXPECT_EQ(must_encode(*tok, "cafe\u0301"), must_encode(*tok, "caf\u00e9"));
}

}  // namespace
}  // namespace lragent
