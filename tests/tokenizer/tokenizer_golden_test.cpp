// Exact agreement with the goldens in tests/fixtures/goldens/tokenizer-NAME.jsonl (written by
// scripts/goldens/tokenizer_goldens.py from HF tokenizers/transformers, or provisionally from the
// transformers.js oracle): same ids for every text, same decode for every id sequence, and the
// StreamDecoder reproducing decode() on all of them.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "encode_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lragent {
namespace {

using testing::must_encode;

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
const Tokenizer& load(const std::string& name, TokenizerFlavor flavor) {
  static std::map<std::pair<std::string, TokenizerFlavor>, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[{name, flavor}];
  if (!slot) {
    auto tok = Tokenizer::load_dir(tokenizer_dir(name), flavor);
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

// Mismatch counts of one tokenizer against a golden; the first few are reported in detail.
struct Tally {
  std::string label;
  int ids = 0, decode = 0, stream = 0, shown = 0;
  double encode_ms = 0;  // wall time to encode all golden texts (first pass: cold word cache)
  void fail(const std::string& what) {
    if (shown++ < 10) ADD_FAILURE() << label << ": " << what;
  }
};

// Encodes every golden text and compares with row[ids_key] (row["ids"] when that key is absent);
// with `decodes`, also checks decode() and the StreamDecoder on every golden id sequence.
Tally check(const Tokenizer& tok, const Golden& g, const std::string& label, const std::string& ids_key, bool decodes) {
  Tally t{label};
  std::vector<std::string> texts;                           // [n] golden texts
  std::vector<std::vector<int32_t>> got(g.encodes.size());  // [n] our ids
  for (const json& row : g.encodes) texts.push_back(row["text"]);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < texts.size(); ++i) got[i] = must_encode(tok, texts[i]);
  t.encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& row = g.encodes[i];
    const auto want = row.value(ids_key, row["ids"]).get<std::vector<int32_t>>();
    if (got[i] != want) {
      ++t.ids;
      t.fail(fmt::format("encode({}) = {} want {}", json(texts[i]).dump(), got[i], want));
    }
  }
  if (!decodes) return t;
  std::vector<std::pair<std::vector<int32_t>, std::string>> cases;  // [k] (ids, decoded)
  for (const json& row : g.encodes) cases.emplace_back(row["ids"].get<std::vector<int32_t>>(), row["decoded"]);
  for (const json& row : g.decodes) cases.emplace_back(row["decode_ids"].get<std::vector<int32_t>>(), row["decoded"]);
  for (const auto& [ids, want] : cases) {
    const std::string got = tok.decode(ids);
    if (got != want) {
      ++t.decode;
      t.fail(fmt::format("decode({}) = {} want {}", json(ids).dump(), json(got).dump(), json(want).dump()));
    }
    if (stream_decode(tok, ids) != got) {
      ++t.stream;
      t.fail(fmt::format("stream decode of {} differs from decode()", json(ids).dump()));
    }
  }
  return t;
}

void check_golden(const std::string& name) {
  const std::string path = golden_path(name);
  // The goldens are committed: a missing one is a failure, not a skip.
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (see docs/tokenizer.md)";
  if (!std::filesystem::exists(tokenizer_dir(name) + "/tokenizer.json"))
    LRAGENT_SKIP_UNLESS_REQUIRED(tokenizer_dir(name) << " is missing: run scripts/fetch-fixtures.sh");
  const Golden g = read_golden(path);
  ASSERT_FALSE(g.encodes.empty()) << path;
  const std::string source = g.header.value("source", std::string("?"));
  // Rows from transformers.AutoTokenizer are checked with the kTransformers flavor; their
  // "ids_tokenizers" (raw tokenizers, present where it disagrees) with kTokenizers. Every
  // other oracle reads tokenizer.json as is.
  const bool by_transformers = g.encodes.front().value("api", std::string()) == "transformers";
  std::vector<Tally> tallies;
  if (by_transformers) {
    tallies.push_back(check(load(name, TokenizerFlavor::kTransformers), g, name + " [transformers]", "ids", true));
    tallies.push_back(
        check(load(name, TokenizerFlavor::kTokenizers), g, name + " [tokenizers]", "ids_tokenizers", false));
  } else {
    tallies.push_back(check(load(name, TokenizerFlavor::kTokenizers), g, name + " [tokenizers]", "ids", true));
  }
  for (const Tally& t : tallies) {
    EXPECT_EQ(t.ids, 0) << t.label;
    EXPECT_EQ(t.decode, 0) << t.label;
    EXPECT_EQ(t.stream, 0) << t.label;
    std::printf(
        "[ golden   ] %s: %zu/%zu texts with identical ids (encoded in %.0f ms), %zu decode cases (%d wrong); "
        "oracle: %s\n",
        t.label.c_str(), g.encodes.size() - t.ids, g.encodes.size(), t.encode_ms, g.encodes.size() + g.decodes.size(),
        t.decode, source.c_str());
  }
}

TEST(TokenizerGolden, TinyStories) { check_golden("tinystories"); }
TEST(TokenizerGolden, Llama3) { check_golden("llama3"); }
TEST(TokenizerGolden, Qwen3) { check_golden("qwen3"); }

}  // namespace
}  // namespace lragent
