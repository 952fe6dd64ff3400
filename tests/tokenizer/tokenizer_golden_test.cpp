// Exact agreement with the goldens in tests/fixtures/goldens/tokenizer-NAME.jsonl (written by
// scripts/goldens/tokenizer_goldens.py from HF tokenizers/transformers, or provisionally from the
// transformers.js oracle): same ids for every text, same decode for every id sequence, and the
// StreamDecoder reproducing decode() on all of them.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

using nlohmann::json;

struct Golden {
  json header;
  std::vector<json> encodes;  // {"text", "ids", "decoded", ...}
  std::vector<json> decodes;  // {"decode_ids", "decoded"}
};

std::string golden_path(const std::string& name) {
  return testing::fixtures_dir() + "/goldens/tokenizer-" + name + ".jsonl";
}

Golden read_golden(const std::string& path) {
  Golden g;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json row = json::parse(line);
    if (row.contains("text")) {
      g.encodes.push_back(std::move(row));
    } else if (row.contains("decode_ids")) {
      g.decodes.push_back(std::move(row));
    } else {
      g.header = std::move(row);
    }
  }
  return g;
}

std::string tokenizer_dir(const std::string& name) {
  return name == "tinystories" ? testing::tinystories_dir() : testing::fetched_fixtures_dir() + "/" + name;
}

// Loading a 10 MB tokenizer.json is slow under the sanitizers: load each one once.
const Tokenizer& load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto tok = Tokenizer::load_dir(tokenizer_dir(name));
    EXPECT_TRUE(tok.ok()) << tok.error().message;
    if (tok.ok()) slot = std::move(tok).value();
  }
  return *slot;
}

// Concatenated StreamDecoder output for `ids`, pushed one at a time.
std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder sd(tok);
  std::string out;
  for (const int32_t id : ids) out += sd.push(id);
  return out + sd.finish();
}

void check_golden(const std::string& name) {
  const std::string path = golden_path(name);
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is missing (see docs/tokenizer.md)";
  if (!std::filesystem::exists(tokenizer_dir(name) + "/tokenizer.json")) {
    GTEST_SKIP() << tokenizer_dir(name) << " is missing: run scripts/fetch-fixtures.sh";
  }
  const Golden g = read_golden(path);
  const Tokenizer& tok = load(name);
  ASSERT_FALSE(g.encodes.empty()) << path;

  int bad_ids = 0, bad_decode = 0, bad_stream = 0, shown = 0;
  auto show = [&](const std::string& what) {
    if (shown++ < 10) ADD_FAILURE() << name << ": " << what;
  };
  for (const json& row : g.encodes) {
    const std::string text = row["text"];
    const auto want = row["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    if (got != want) {
      ++bad_ids;
      show(fmt::format("encode({}) = {} want {}{}", json(text).dump(), got, want,
                       row.contains("ids_tokenizers") ? " (raw tokenizers gives " +
                                                            row["ids_tokenizers"].dump() + ")"
                                                      : ""));
    }
    const std::string decoded = tok.decode(want);
    if (decoded != row["decoded"].get<std::string>()) {
      ++bad_decode;
      show(fmt::format("decode({}) = {} want {}", json(want).dump(), json(decoded).dump(), row["decoded"].dump()));
    }
    if (stream_decode(tok, want) != decoded) {
      ++bad_stream;
      show(fmt::format("stream decode of {} differs from decode()", json(want).dump()));
    }
  }
  for (const json& row : g.decodes) {
    const auto ids = row["decode_ids"].get<std::vector<int32_t>>();
    const std::string decoded = tok.decode(ids);
    if (decoded != row["decoded"].get<std::string>()) {
      ++bad_decode;
      show(fmt::format("decode({}) = {} want {}", json(ids).dump(), json(decoded).dump(), row["decoded"].dump()));
    }
    if (stream_decode(tok, ids) != decoded) {
      ++bad_stream;
      show(fmt::format("stream decode of {} differs from decode()", json(ids).dump()));
    }
  }
  EXPECT_EQ(bad_ids, 0);
  EXPECT_EQ(bad_decode, 0);
  EXPECT_EQ(bad_stream, 0);
  std::printf("[ golden   ] %s: %zu/%zu texts with identical ids, %zu decode cases; oracle: %s\n", name.c_str(),
              g.encodes.size() - bad_ids, g.encodes.size(), g.decodes.size(),
              g.header.value("source", std::string("?")).c_str());
}

TEST(TokenizerGolden, TinyStories) { check_golden("tinystories"); }
TEST(TokenizerGolden, Llama3) { check_golden("llama3"); }
TEST(TokenizerGolden, Qwen3) { check_golden("qwen3"); }

}  // namespace
}  // namespace lragent
