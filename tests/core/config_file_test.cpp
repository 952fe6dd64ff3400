// The flags file (`--config`, vLLM's YAML subset): what it reads, and each thing it does not
// read refused with its line and what to write instead.
#include "core/config_file.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lragent {
namespace {

std::vector<ConfigEntry> ok(std::string_view text) {
  auto r = parse_config_file(text, "f.yaml");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : std::vector<ConfigEntry>{};
}

// The message of a refused file; it names the file and line.
std::string refused(std::string_view text, int line) {
  auto r = parse_config_file(text, "f.yaml");
  EXPECT_FALSE(r.ok()) << text;
  if (r.ok()) return {};
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().message.rfind("f.yaml, line " + std::to_string(line) + ": ", 0), 0u) << r.error().message;
  return r.error().message;
}

TEST(ConfigFile, ReadsVllmsFlatYaml) {
  const auto e = ok(
      "\xEF\xBB\xBF# lragent serve --config serve.yaml\n"
      "---\n"
      "model: /models/llama 3   # a comment\n"
      "port: 8000\r\n"
      "max_model_len: 4096\n"
      "\n"
      "enable-lora: true\n"
      "lora-modules:\n"
      "  - plan=/a/plan\n"
      "  # a comment between items\n"
      "  - 'action=/a/it''s'\n"
      "allowed-origins: [\"http://a:1\", 'b', c d ]\n"
      "allowed-headers: []\n"
      "served-model-name:\n"
      "- base\n"
      "- \"x#y\"\n"
      "override-generation-config: {\"temperature\": 0.5, \"stop\": [\"a\"]}\n"
      "chat-template: \"{{ a }}\\n\\t\\\"q\\\" \\\\ \\u00e9\\U0001F600\\x41\"\n"
      "api-key: a#b\n"
      "...\n");
  ASSERT_EQ(e.size(), 11u);
  EXPECT_EQ(e[0].key, "model");
  EXPECT_EQ(e[0].values, std::vector<std::string>{"/models/llama 3"});
  EXPECT_FALSE(e[0].list);
  EXPECT_EQ(e[0].line, 3);
  EXPECT_EQ(e[1].values, std::vector<std::string>{"8000"});  // the CR of a CRLF line is not the value's
  EXPECT_EQ(e[2].key, "max-model-len");                       // '_' read as '-', as vLLM reads it
  EXPECT_EQ(e[3].values, std::vector<std::string>{"true"});
  EXPECT_EQ(e[4].key, "lora-modules");
  EXPECT_TRUE(e[4].list);
  EXPECT_EQ(e[4].values, (std::vector<std::string>{"plan=/a/plan", "action=/a/it's"}));
  EXPECT_EQ(e[5].values, (std::vector<std::string>{"http://a:1", "b", "c d"}));
  EXPECT_TRUE(e[6].list);
  EXPECT_TRUE(e[6].values.empty());
  EXPECT_EQ(e[7].values, (std::vector<std::string>{"base", "x#y"}));  // compact "- " at column 0
  EXPECT_EQ(e[8].values, std::vector<std::string>{"{\"temperature\": 0.5, \"stop\": [\"a\"]}"});
  EXPECT_EQ(e[9].values, std::vector<std::string>{"{{ a }}\n\t\"q\" \\ \xC3\xA9\xF0\x9F\x98\x80" "A"});
  EXPECT_EQ(e[10].values, std::vector<std::string>{"a#b"});  // '#' starts a comment only after a space
  EXPECT_TRUE(ok("").empty());
  EXPECT_TRUE(ok("# nothing\n\n   \n").empty());
}

TEST(ConfigFile, RefusesWhatItDoesNotReadNamingTheLine) {
  EXPECT_NE(refused("model: a\n\tport: 1\n", 2).find("tab"), std::string::npos);
  EXPECT_NE(refused("model: a\nspeculative:\n  method: ngram\n", 3).find("list item"), std::string::npos);
  EXPECT_NE(refused("model: a\n  port: 1\n", 2).find("nested mappings"), std::string::npos);
  EXPECT_NE(refused("model: &m a\n", 1).find("anchors"), std::string::npos);
  EXPECT_NE(refused("model: *m\n", 1).find("aliases"), std::string::npos);
  EXPECT_NE(refused("model: !!str a\n", 1).find("tags"), std::string::npos);
  EXPECT_NE(refused("chat-template: |\n  {{ a }}\n", 1).find("block scalars"), std::string::npos);
  EXPECT_NE(refused("port: 1\nport: 2\n", 2).find("'port' is given twice"), std::string::npos);
  EXPECT_NE(refused("max_model_len: 1\nmax-model-len: 2\n", 2).find("twice"), std::string::npos);
  EXPECT_NE(refused("lora-modules:\nport: 1\n", 2).find("'lora-modules') has no value"), std::string::npos);
  EXPECT_NE(refused("port: 1\nlora-modules:\n", 2).find("'lora-modules' has no value"), std::string::npos);
  EXPECT_NE(refused("model: \"a\n", 1).find("does not end on its line"), std::string::npos);
  EXPECT_NE(refused("model: 'a\n", 1).find("single-quoted"), std::string::npos);
  EXPECT_NE(refused("model: \"a\\qb\"\n", 1).find("'\\q' is not an escape"), std::string::npos);
  EXPECT_NE(refused("model: \"\\u12\"\n", 1).find("4 hexadecimal digits"), std::string::npos);
  EXPECT_NE(refused("model: \"\\ud800\"\n", 1).find("no Unicode character"), std::string::npos);
  EXPECT_NE(refused("model: null\n", 1).find("leave the key out"), std::string::npos);
  EXPECT_NE(refused("model: ~\n", 1).find("leave the key out"), std::string::npos);
  EXPECT_NE(refused("model: \"a\" b\n", 1).find("text after"), std::string::npos);
  EXPECT_NE(refused("--model: a\n", 1).find("without the leading"), std::string::npos);
  EXPECT_NE(refused("model a\n", 1).find("flag-name: value"), std::string::npos);
  EXPECT_NE(refused("-: a\n", 1).find("flag-name: value"), std::string::npos);  // only dashes (found by the fuzzer)
  EXPECT_NE(refused("---: a\n", 1).find("flag-name: value"), std::string::npos);
  EXPECT_NE(refused("model:a\n", 1).find("flag-name: value"), std::string::npos);
  EXPECT_NE(refused("x: [a, b\n", 1).find("does not end on its line"), std::string::npos);
  EXPECT_NE(refused("x: [a b] c\n", 1).find("text after"), std::string::npos);
  EXPECT_NE(refused("x: [a, [b]]\n", 1).find("inside a list"), std::string::npos);
  EXPECT_NE(refused("x: {\"a\": 1\n", 1).find("mapping"), std::string::npos);
  EXPECT_NE(refused("x:\n  - [a]\n", 2).find("nested lists"), std::string::npos);
  EXPECT_NE(refused("- a\n", 1).find("flag-name: value"), std::string::npos);  // an item with no key
}

}  // namespace
}  // namespace lragent
