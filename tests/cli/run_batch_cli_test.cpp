// `lragent run-batch` (vLLM's run-batch, OpenAI's batch file format) as a process: every line
// answered in the input's order as `lragent serve` would answer it, a request's own error written in
// its line while the batch goes on, and a malformed input refused with its line before anything runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_util.h"

namespace lragent {
namespace {

using nlohmann::json;
using testing::shell_quote;

std::string engine_args() {
  std::string a = "--model " + shell_quote(testing::tinystories_dir());
  for (const char* role : {"plan", "action"})
    a += " --adapter " + std::string(role) + "=" +
         shell_quote(testing::adapters_dir() + "/qv-shared-a-r8/" + role);
  return a;
}

std::vector<json> read_lines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

json line(const std::string& id, const std::string& url, const json& body) {
  return {{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}};
}

TEST(RunBatchCli, AnswersEveryLineInOrderAsTheServerWould) {
  const std::string dir = testing::temp_dir("run-batch");
  const std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl";
  const json greedy = {{"model", "plan"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
  {
    std::ofstream f(in);
    f << line("a", "/v1/completions", greedy).dump() << "\n";
    f << line("b", "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 600}}).dump() << "\n";
    f << line("c", "/v1/embeddings", {{"input", "x"}}).dump() << "\n\n";  // a blank line is skipped
    f << line("d", "/v1/completions", {{"model", "action"}, {"prompt", "Once upon a time"}, {"max_tokens", 8},
                                       {"temperature", 0}, {"n", 2}}).dump() << "\n";
    f << line("e", "/v1/completions", {{"prompt", "x"}, {"stream", true}}).dump() << "\n";
    for (int i = 0; i < 6; ++i)  // more than --max-concurrency, so the workers take turns
      f << line("f" + std::to_string(i), "/v1/completions", greedy).dump() << "\n";
  }
  // --kv-share none: the plan and action requests on one prompt run at once, and in a mode that
  // shares caches across agents the agent that computes the prompt first sets what the other
  // reads (that mode's approximation, docs/kv.md), so their text would depend on the timing.
  const testing::CliRun r = testing::run_lragent("run-batch -i " + shell_quote(in) + " -o " + shell_quote(out) +
                                                 " --max-concurrency 3 --kv-share none " + engine_args());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<json> got = read_lines(out);
  ASSERT_EQ(got.size(), 11u);
  const std::vector<std::string> ids = {"a", "b", "c", "d", "e", "f0", "f1", "f2", "f3", "f4", "f5"};
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i]["custom_id"], ids[i]);
    EXPECT_EQ(got[i]["id"].get<std::string>().rfind("lragent-", 0), 0u);
    EXPECT_EQ(got[i]["response"]["request_id"].get<std::string>().rfind("lragent-batch-", 0), 0u);
  }
  // The same text as `generate` with the plan adapter, the same answer for the same request.
  const testing::CliRun g = testing::run_lragent("generate " + engine_args() +
                                                 " --use plan --prompt 'Once upon a time' --max-tokens 8 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  const json& a = got[0];
  EXPECT_EQ(a["response"]["status_code"], 200);
  EXPECT_TRUE(a["error"].is_null());
  EXPECT_EQ(a["response"]["body"]["object"], "text_completion");
  EXPECT_EQ(a["response"]["body"]["choices"][0]["text"], json::parse(g.out)["text"]);
  for (size_t i = 5; i < got.size(); ++i)
    EXPECT_EQ(got[i]["response"]["body"]["choices"][0]["text"], a["response"]["body"]["choices"][0]["text"]);
  // A request's own error is its line's; the batch went on.
  EXPECT_EQ(got[1]["response"]["status_code"], 400);
  EXPECT_TRUE(got[1]["response"]["body"].is_null());
  EXPECT_NE(got[1]["error"]["message"].get<std::string>().find("maximum context length"), std::string::npos) << got[1];
  EXPECT_EQ(got[2]["response"]["status_code"], 400);
  EXPECT_NE(got[2]["error"]["message"].get<std::string>().find("URL /v1/embeddings was used"), std::string::npos);
  EXPECT_EQ(got[3]["response"]["body"]["choices"].size(), 2u);
  const testing::CliRun ga = testing::run_lragent("generate " + engine_args() +
                                                  " --use action --prompt 'Once upon a time' --max-tokens 8 --json");
  ASSERT_EQ(ga.code, 0) << ga.err;
  for (const json& c : got[3]["response"]["body"]["choices"]) EXPECT_EQ(c["text"], json::parse(ga.out)["text"]);
  EXPECT_EQ(got[4]["response"]["status_code"], 400);
  EXPECT_NE(got[4]["error"]["message"].get<std::string>().find("stream"), std::string::npos);
  EXPECT_NE(r.err.find("11/11 requests, 3 failed"), std::string::npos) << r.err;
}

TEST(RunBatchCli, AMalformedInputIsRefusedWithItsLineBeforeAnythingRuns) {
  const std::string dir = testing::temp_dir("run-batch-bad");
  const std::string out = dir + "/out.jsonl";
  const json ok = line("a", "/v1/completions", {{"prompt", "x"}});
  for (const auto& [text, words] : std::vector<std::pair<std::string, std::string>>{
           {ok.dump() + "\n{not json\n", "line 2: not a JSON object"},
           {ok.dump() + "\n" + ok.dump() + "\n", "line 2: custom_id \"a\" is given twice"},
           {json{{"custom_id", "a"}, {"method", "GET"}, {"url", "/v1/completions"}, {"body", json::object()}}.dump(),
            "line 1: \"method\" must be \"POST\""},
           {json{{"custom_id", "a"}, {"method", "POST"}, {"url", "/v1/completions"}}.dump(), "line 1: no \"body\""},
           {"\n\n", "no requests"}}) {
    const std::string in = dir + "/in.jsonl";
    std::ofstream(in) << text;
    std::filesystem::remove(out);
    const testing::CliRun r =
        testing::run_lragent("run-batch -i " + shell_quote(in) + " -o " + shell_quote(out) + " " + engine_args());
    EXPECT_EQ(r.code, 2) << text;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("loading model"), std::string::npos) << "checked before the model loads";
    EXPECT_FALSE(std::filesystem::exists(out)) << "no output for a batch that did not run";
  }
}

}  // namespace
}  // namespace lragent
