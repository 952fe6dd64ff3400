// Malformed tokenizer.json / tokenizer_config.json give one clear Error naming the file and the
// cause, never a crash (the suite runs under ASan/UBSan).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "encode_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

using testing::must_encode;

using nlohmann::json;

constexpr const char* kSource = "models/x/tokenizer.json";

// A small valid tokenizer that each test breaks in one place.
json valid() {
  return {{"added_tokens", {{{"id", 3}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"<s>", 3}}}, {"merges", {"a b"}}}}};
}

Error load_error(const std::string& text, const std::string& config = "") {
  auto r = Tokenizer::from_json(text, config, kSource);
  EXPECT_FALSE(r.ok()) << "loaded: " << text.substr(0, 200);
  return r.ok() ? Error{} : r.error();
}

// The error is of `code`, names the file, and contains `cause`.
void expect_error(const json& j, ErrorCode code, const std::string& cause) {
  const Error e = load_error(j.dump());
  EXPECT_EQ(e.code, code) << e.message;
  EXPECT_NE(e.message.find(kSource), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(cause), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
}

TEST(TokenizerMalformed, ValidBaseLoads) {
  auto r = Tokenizer::from_json(valid().dump(), "", kSource);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(must_encode(*r.value(), "ab<s>"), (std::vector<int32_t>{2, 3}));
}

TEST(TokenizerMalformed, NotJson) {
  for (const std::string text : {"", "{", "not json", "{\"model\": }", "[1, 2", "\xff\xfe"}) {
    const Error e = load_error(text);
    EXPECT_EQ(e.code, ErrorCode::kCorrupt);
    EXPECT_NE(e.message.find(std::string(kSource) + ": invalid JSON"), std::string::npos) << e.message;
  }
  const std::string cut = testing::read_file(testing::tinystories_dir() + "/tokenizer.json");
  ASSERT_GT(cut.size(), 1000u);
  EXPECT_EQ(load_error(cut.substr(0, cut.size() / 2)).code, ErrorCode::kCorrupt);
}

TEST(TokenizerMalformed, WrongShapes) {
  expect_error(json::array(), ErrorCode::kCorrupt, "expected an object");
  json j = valid();
  j.erase("model");
  expect_error(j, ErrorCode::kCorrupt, "missing \"model\"");
  j = valid();
  j["model"]["vocab"] = json::array({"a"});
  expect_error(j, ErrorCode::kCorrupt, "model.vocab: expected an object");
  j = valid();
  j["model"]["vocab"]["a"] = -1;
  expect_error(j, ErrorCode::kCorrupt, "model.vocab.a: token id -1 is out of range");
  j = valid();
  j["model"]["vocab"]["a"] = "zero";
  expect_error(j, ErrorCode::kCorrupt, "expected a token id");
  j = valid();
  j["model"]["vocab"]["a"] = 2000000000;
  expect_error(j, ErrorCode::kCorrupt, "model.vocab.a: token id 2000000000 is out of range (0 to 16777215)");
  j = valid();
  j["model"]["vocab"]["a"] = 8000000;
  expect_error(j, ErrorCode::kCorrupt, "ids are too sparse");
  j = valid();
  j["added_tokens"][0]["id"] = 2147483647;  // its table size (id + 1) once overflowed an int32
  expect_error(j, ErrorCode::kCorrupt, "token id 2147483647 is out of range");
  j = valid();
  j["added_tokens"][0].erase("id");
  expect_error(j, ErrorCode::kCorrupt, "added_tokens[0].id: missing");
  j = valid();
  j["added_tokens"][0]["special"] = "yes";
  expect_error(j, ErrorCode::kCorrupt, "added_tokens[0].special: expected a boolean");
}

TEST(TokenizerMalformed, UnsupportedModels) {
  for (const std::string type : {"WordPiece", "Unigram", "WordLevel"}) {
    json j = valid();
    j["model"]["type"] = type;
    expect_error(j, ErrorCode::kUnsupported, "model type \"" + type + "\" is not supported");
  }
  json j = valid();
  j["model"]["dropout"] = 0.1;
  expect_error(j, ErrorCode::kUnsupported, "dropout");
}

TEST(TokenizerMalformed, BadMerges) {
  json j = valid();
  j["model"]["merges"] = {"a b", "a zz"};
  expect_error(j, ErrorCode::kCorrupt, "model.merges[1]: merge \"a zz\" needs token \"zz\"");
  j["model"]["merges"] = {"b a"};  // both sides known, but "ba" is not
  expect_error(j, ErrorCode::kCorrupt, "needs token \"ba\"");
  j["model"]["merges"] = {"ab"};
  expect_error(j, ErrorCode::kCorrupt, "is not two tokens separated by one space");
  j["model"]["merges"] = json::array({json::array({"a"})});  // a one-element brace list collapses under clang
  expect_error(j, ErrorCode::kCorrupt, "a merge must be");
  j["model"]["merges"] = "a b";
  expect_error(j, ErrorCode::kCorrupt, "model.merges: expected an array");
  j = valid();
  j["model"]["unk_token"] = "<unk>";
  expect_error(j, ErrorCode::kCorrupt, "model.unk_token: \"<unk>\" is not in the vocab");
}

TEST(TokenizerMalformed, BadRegex) {
  json j = valid();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error(j, ErrorCode::kCorrupt, "pre_tokenizer.pattern.Regex: bad regex \"(unclosed\"");
  j["pre_tokenizer"]["pattern"] = {{"Regex", "[\\W]"}};
  expect_error(j, ErrorCode::kUnsupported, "inside a character class");
  j["pre_tokenizer"]["pattern"] = {{"Neither", "x"}};
  expect_error(j, ErrorCode::kCorrupt, "pattern needs a \"String\" or \"Regex\" member");
  j["pre_tokenizer"]["pattern"] = {{"String", "x"}};
  j["pre_tokenizer"]["behavior"] = "Sideways";
  expect_error(j, ErrorCode::kCorrupt, "unknown split behavior \"Sideways\"");
}

TEST(TokenizerMalformed, UnsupportedComponents) {
  json j = valid();
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j, ErrorCode::kUnsupported, "normalizer: normalizer type \"NFKC\" is not supported");
  j = valid();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}};
  expect_error(j, ErrorCode::kUnsupported, "pre_tokenizer.pretokenizers[0]: pre-tokenizer type \"Whitespace\"");
  j = valid();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, ErrorCode::kUnsupported, "decoder type \"WordPiece\"");
  j = valid();
  j["post_processor"] = {{"type", "Mystery"}};
  expect_error(j, ErrorCode::kUnsupported, "post-processor type \"Mystery\"");
  j = valid();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "__"}};
  expect_error(j, ErrorCode::kCorrupt, "pre_tokenizer.replacement: expected exactly one character");
  j = valid();
  j["normalizer"] = {{"no_type", true}};
  expect_error(j, ErrorCode::kCorrupt, "normalizer.type: missing");
}

TEST(TokenizerMalformed, BadTemplate) {
  json j = valid();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}}},
                         {"special_tokens", json::object()}};
  expect_error(j, ErrorCode::kCorrupt, "post_processor.special_tokens: missing special token \"<bos>\"");
}

TEST(TokenizerMalformed, BadConfig) {
  auto r = Tokenizer::from_json(valid().dump(), "{oops", kSource);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("models/x/tokenizer_config.json: invalid JSON"), std::string::npos)
      << r.error().message;
  r = Tokenizer::from_json(valid().dump(), R"({"add_bos_token": "yes"})", kSource);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tokenizer_config.json: add_bos_token: expected a boolean"), std::string::npos)
      << r.error().message;
}

TEST(TokenizerMalformed, MissingDirectory) {
  auto r = Tokenizer::load_dir("/nonexistent/lragent-tokenizer");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_NE(r.error().message.find("/nonexistent/lragent-tokenizer/tokenizer.json"), std::string::npos);
}

// Random byte edits of a real tokenizer.json: loading (and using what loads) must never crash.
TEST(TokenizerMalformed, MutatedRealFileNeverCrashes) {
  const std::string base = testing::read_file(testing::tinystories_dir() + "/tokenizer.json");
  ASSERT_FALSE(base.empty());
  std::mt19937 rng(7);
  int loaded = 0;
  for (int round = 0; round < 150; ++round) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[pos] = static_cast<char>(rng() % 256);
          break;
        case 1:
          text.erase(pos, 1 + rng() % 16);
          break;
        default:
          text.insert(pos, 1, "{}[]\",:0\\"[rng() % 9]);
      }
    }
    auto r = Tokenizer::from_json(text, "", kSource);
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find(kSource), std::string::npos) << r.error().message;
      continue;
    }
    ++loaded;
    const auto ids = must_encode(*r.value(), "Once upon a time, <|start_story|> caf\xC3\xA9 \xE4\xB8");
    (void)r.value()->decode(ids);
  }
  std::printf("[ mutated  ] %d of 150 byte-mutated files still loaded\n", loaded);
}

// Well-formed JSON with wrong values in the places the loader reads.
TEST(TokenizerMalformed, MutatedValuesNeverCrash) {
  const json base = json::parse(testing::read_file(testing::tinystories_dir() + "/tokenizer.json"));
  const std::vector<json> values = {
      nullptr,        -1,  0, 7, 1u << 31, 3.5, "", "x", "\u2581", "(", "[\\W]", json::array(), json::array({"a"}),
      json::object(), true};
  const std::vector<std::string> paths = {"/model/type",
                                          "/model/unk_token",
                                          "/model/fuse_unk",
                                          "/model/byte_fallback",
                                          "/model/merges/3",
                                          "/model/merges",
                                          "/model/vocab/e",
                                          "/model/vocab",
                                          "/model/dropout",
                                          "/model/continuing_subword_prefix",
                                          "/added_tokens/0/id",
                                          "/added_tokens/1/content",
                                          "/added_tokens/2/normalized",
                                          "/added_tokens",
                                          "/normalizer/type",
                                          "/normalizer/normalizers/0/prepend",
                                          "/normalizer/normalizers/1/pattern",
                                          "/normalizer/normalizers/1/pattern/String",
                                          "/post_processor/single/0",
                                          "/post_processor/special_tokens",
                                          "/decoder/decoders/0/pattern/String",
                                          "/decoder/decoders/3/start",
                                          "/decoder/decoders/3/content",
                                          "/decoder/type",
                                          "/pre_tokenizer"};
  std::mt19937 rng(11);
  int loaded = 0;
  for (int round = 0; round < 150; ++round) {
    json j = base;
    j[json::json_pointer(paths[rng() % paths.size()])] = values[rng() % values.size()];
    auto r = Tokenizer::from_json(j.dump(), "", kSource);
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find(kSource), std::string::npos) << r.error().message;
      continue;
    }
    ++loaded;
    const auto ids = must_encode(*r.value(), "Once upon a time, <|start_story|> caf\xC3\xA9 \xE4\xB8");
    StreamDecoder sd(*r.value());
    std::string streamed;
    for (const int32_t id : ids) streamed += sd.push(id);
    EXPECT_EQ(streamed + sd.finish(), r.value()->decode(ids));
  }
  std::printf("[ mutated  ] %d of 150 value-mutated files still loaded\n", loaded);
}

}  // namespace
}  // namespace lragent
