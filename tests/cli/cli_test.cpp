// The CLI contract: JSON output of generate/tokenize/replay, and bad input giving one clear
// error line (naming the file and the cause) with a non-zero exit code and no crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_util.h"

namespace lragent {
namespace {

namespace fs = std::filesystem;

using testing::CliRun;
using testing::shell_quote;

CliRun run_cli(const std::string& args) { return testing::run_lragent(args); }

std::string model_arg() { return "--model " + shell_quote(testing::tinystories_dir()); }

// The last line of stderr, which must be the one error line.
std::string error_line(const CliRun& r) {
  std::string e = r.err;
  while (!e.empty() && e.back() == '\n') e.pop_back();
  const size_t nl = e.rfind('\n');
  return nl == std::string::npos ? e : e.substr(nl + 1);
}

TEST(Cli, GenerateJsonContract) {
  const CliRun r = run_cli("generate " + model_arg() +
                        " --prompt 'Once upon a time' --max-tokens 8 --temperature 0 --json --logits");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"][0], 1) << "BOS first, as HF adds it";
  EXPECT_EQ(j["output_tokens"].size(), 8u);
  EXPECT_TRUE(j["text"].is_string());
  // Decoded after the prompt, as vLLM decodes a completion: a first word keeps its space (its
  // token's text is "▁an", which HF's decode of the output alone would strip).
  const CliRun comma = run_cli("generate " + model_arg() + " --prompt 'Once upon a time,' --max-tokens 2 --json");
  ASSERT_EQ(comma.code, 0) << comma.err;
  EXPECT_EQ(nlohmann::json::parse(comma.out)["text"], " an or") << comma.out;
  EXPECT_EQ(j["last_logits"].size(), 2048u);
  const CliRun ids = run_cli("generate " + model_arg() + " --prompt-tokens 1,500,300 --max-tokens 3 --json");
  ASSERT_EQ(ids.code, 0) << ids.err;
  EXPECT_EQ(nlohmann::json::parse(ids.out)["prompt_tokens"], nlohmann::json::array({1, 500, 300}));
}

// Decode lookahead (the default) and step-by-step decoding give the same tokens, sampled and
// stopping at EOS; a model directory without tokenizer.json streams ids, not text, or takes one
// from --tokenizer.
TEST(Cli, GenerateLookaheadAndNoTokenizer) {
  const std::string args = " --prompt 'Once upon a time' --max-tokens 40 --temperature 0.9 --top-p 0.95 --seed 5 --json";
  const CliRun on = run_cli("generate " + model_arg() + args);
  const CliRun off = run_cli("generate " + model_arg() + args + " --no-decode-lookahead");
  ASSERT_EQ(on.code, 0) << on.err;
  ASSERT_EQ(off.code, 0) << off.err;
  const auto a = nlohmann::json::parse(on.out), b = nlohmann::json::parse(off.out);
  EXPECT_EQ(a["output_tokens"], b["output_tokens"]);
  EXPECT_EQ(a["finish_reason"], b["finish_reason"]);
  EXPECT_FALSE(a["output_tokens"].empty());

  const std::string dir = testing::temp_dir("notokenizer");
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(testing::tinystories_dir() + "/" + f, dir + "/" + f);
  const CliRun ids = run_cli("generate --model " + shell_quote(dir) + " --prompt-tokens 1,500,300 --max-tokens 5");
  ASSERT_EQ(ids.code, 0) << ids.err;
  EXPECT_EQ(std::count(ids.out.begin(), ids.out.end(), ','), 4) << ids.out;  // five ids, comma-separated

  // --tokenizer (vLLM's) gives it one from another directory: the text and tokens of the whole model's.
  const std::string greedy = " --prompt 'Once upon a time' --max-tokens 12 --temperature 0 --json";
  const CliRun whole = run_cli("generate " + model_arg() + greedy);
  const CliRun lent = run_cli("generate --model " + shell_quote(dir) + " --tokenizer " +
                              shell_quote(testing::tinystories_dir()) + greedy);
  ASSERT_EQ(whole.code, 0) << whole.err;
  ASSERT_EQ(lent.code, 0) << lent.err;
  EXPECT_EQ(nlohmann::json::parse(lent.out)["output_tokens"], nlohmann::json::parse(whole.out)["output_tokens"]);
  EXPECT_EQ(nlohmann::json::parse(lent.out)["text"], nlohmann::json::parse(whole.out)["text"]);
  const CliRun missing = run_cli("generate --model " + shell_quote(dir) + " --tokenizer " + shell_quote(dir) + greedy);
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(error_line(missing).find("--tokenizer " + dir + ": no tokenizer.json there"), std::string::npos) << missing.err;
  const CliRun alone = run_cli("generate --tokenizer " + shell_quote(testing::tinystories_dir()) + greedy);
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(error_line(alone).find("give --model too"), std::string::npos) << alone.err;
}

// --speculative-config on generate and replay: the same tokens, the drafts counted in the JSON;
// a config lragent cannot run is refused before the model loads, naming the flag.
TEST(Cli, SpeculativeDecodingGivesTheSameTokens) {
  const std::string spec =
      " --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_min\": 1, "
      "\"prompt_lookup_max\": 3}'";
  const std::string args = " --prompt 'Lily had a red ball. Lily liked the red ball. Lily' --max-tokens 60 --json";
  const CliRun plain = run_cli("generate " + model_arg() + args);
  const CliRun fast = run_cli("generate " + model_arg() + args + spec);
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(fast.code, 0) << fast.err;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(fast.out);
  EXPECT_EQ(b["output_tokens"], a["output_tokens"]);
  EXPECT_EQ(b["text"], a["text"]);
  EXPECT_FALSE(a.contains("speculative"));
  ASSERT_TRUE(b.contains("speculative")) << fast.out;
  EXPECT_GT(b["speculative"]["accepted_tokens"].get<int>(), 0) << fast.out;
  // Suffix decoding: the same tokens.
  const CliRun suffix = run_cli("generate " + model_arg() + args +
                                " --speculative-config '{\"method\": \"suffix\", \"num_speculative_tokens\": 8}'");
  ASSERT_EQ(suffix.code, 0) << suffix.err;
  EXPECT_EQ(nlohmann::json::parse(suffix.out)["output_tokens"], a["output_tokens"]);
  // Sampled, seeded: the same text too.
  const std::string sampled = args + " --temperature 0.3 --seed 9";
  const CliRun plain_sampled = run_cli("generate " + model_arg() + sampled);
  const CliRun fast_sampled = run_cli("generate " + model_arg() + sampled + spec);
  ASSERT_EQ(plain_sampled.code, 0) << plain_sampled.err;
  ASSERT_EQ(fast_sampled.code, 0) << fast_sampled.err;
  const auto c = nlohmann::json::parse(plain_sampled.out), d = nlohmann::json::parse(fast_sampled.out);
  EXPECT_EQ(d["output_tokens"], c["output_tokens"]);
  EXPECT_NE(c["output_tokens"], a["output_tokens"]) << "sampled, not greedy";
  ASSERT_TRUE(d.contains("speculative")) << fast_sampled.out;
  EXPECT_GT(d["speculative"]["accepted_tokens"].get<int>(), 0) << fast_sampled.out;

  const CliRun eagle = run_cli("generate " + model_arg() + args +
                               " --speculative-config '{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'");
  EXPECT_EQ(eagle.code, 5) << eagle.err;
  EXPECT_NE(error_line(eagle).find("--speculative-config: method \"eagle\" is not supported"), std::string::npos)
      << eagle.err;
  EXPECT_EQ(eagle.err.find("loading model"), std::string::npos) << "refused before the weights load";
  const CliRun bad = run_cli("replay " + model_arg() + " --adapter plan=" +
                             shell_quote(testing::adapters_dir() + "/qv-shared-a-r8/plan") + " --script " +
                             shell_quote(testing::source_dir() + "/examples/replay-hotpotqa.json") +
                             " --speculative-config '{\"method\": \"ngram\"}'");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("\"num_speculative_tokens\" is required"), std::string::npos) << bad.err;
}

TEST(Cli, TokenizeAndDefaultModel) {
  const CliRun t = run_cli("tokenize " + model_arg() + " --text 'Hello world' --json");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(nlohmann::json::parse(t.out)["ids"][0], 1);
  const CliRun d = run_cli("generate --prompt hi --max-tokens 4 --json");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("synthetic"), std::string::npos) << "the default model must say it is synthetic";
}

// vLLM's --config: a command's flags from a YAML file, the command line winning; a required flag
// may come from it; a key that is no flag of the command, or a file it cannot read, is refused.
TEST(Cli, FlagsFromAConfigFile) {
  const std::string dir = testing::temp_dir("config-file");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return shell_quote(dir + "/" + name);
  };
  const std::string flags = " --prompt 'Once upon a time' --max-tokens 8 --temperature 0 --json";
  const CliRun direct = run_cli("generate " + model_arg() + flags);
  ASSERT_EQ(direct.code, 0) << direct.err;
  const std::string gen = write("gen.yaml", "# generate\nmodel: " + testing::tinystories_dir() +
                                                "\nprompt: \"Once upon a time\"\nmax_tokens: 8\ntemperature: 0\njson: true\n");
  const CliRun from_file = run_cli("generate --config " + gen);
  ASSERT_EQ(from_file.code, 0) << from_file.err;
  EXPECT_EQ(nlohmann::json::parse(from_file.out)["output_tokens"], nlohmann::json::parse(direct.out)["output_tokens"]);
  const CliRun wins = run_cli("generate --max-tokens 3 --config=" + gen);
  ASSERT_EQ(wins.code, 0) << wins.err;
  EXPECT_EQ(nlohmann::json::parse(wins.out)["output_tokens"].size(), 3u);
  // tokenize's --text is required: given by the file.
  const CliRun tok = run_cli("tokenize " + model_arg() + " --json --config " + write("tok.yaml", "text: Hello world\n"));
  ASSERT_EQ(tok.code, 0) << tok.err;
  EXPECT_EQ(nlohmann::json::parse(tok.out)["ids"][0], 1);
  const CliRun unknown = run_cli("generate --config " + write("bad.yaml", "prompt: hi\nbogus: 1\n"));
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("line 2: 'bogus' is not a flag of `lragent generate`"), std::string::npos) << unknown.err;
  const CliRun nested = run_cli("generate --config " + write("nested.yaml", "prompt: hi\nsampling:\n  seed: 1\n"));
  EXPECT_EQ(nested.code, 2);
  EXPECT_NE(nested.err.find("line 3"), std::string::npos) << nested.err;
  const CliRun missing = run_cli("generate --config " + shell_quote(dir + "/none.yaml"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("none.yaml"), std::string::npos) << missing.err;
}

class BadModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("badmodel");
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(testing::tinystories_dir() + "/" + f, dir_ + "/" + f);
    weights_ = testing::read_file(testing::tinystories_dir() + "/model.safetensors");
  }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  CliRun generate() { return run_cli("generate --model " + shell_quote(dir_) + " --prompt-tokens 1,2,3 --max-tokens 2"); }
  std::string dir_, weights_;
};

TEST_F(BadModel, TruncatedSafetensors) {
  write("model.safetensors", weights_.substr(0, weights_.size() / 2));
  const CliRun r = generate();
  EXPECT_EQ(r.code, 4) << r.err;  // a cut file is corrupt
  EXPECT_LT(r.code, 128) << "crashed: " << r.err;
  EXPECT_NE(error_line(r).find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_EQ(error_line(r).rfind("error: ", 0), 0u) << r.err;
}

TEST_F(BadModel, HeaderOffsetsOutOfRange) {
  std::string w = weights_;
  const size_t pos = w.find("\"data_offsets\":[");
  ASSERT_NE(pos, std::string::npos);
  w.replace(pos + 16, 1, "9");  // first offset digit becomes 9...: past the end or overlapping
  write("model.safetensors", w);
  const CliRun r = generate();
  EXPECT_EQ(r.code, 4) << r.err;  // offsets past the data are corrupt
  EXPECT_LT(r.code, 128) << "crashed: " << r.err;
  EXPECT_NE(error_line(r).find("model.safetensors"), std::string::npos) << r.err;
}

TEST_F(BadModel, MissingTensorAndShapeMismatch) {
  write("model.safetensors", weights_);
  std::string cfg = testing::read_file(dir_ + "/config.json");
  // More layers than the checkpoint holds: a missing tensor.
  std::string more = cfg;
  more.replace(more.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 3");
  write("config.json", more);
  CliRun r = generate();
  EXPECT_EQ(r.code, 3) << r.err;  // a missing tensor is not found
  EXPECT_NE(error_line(r).find("model.layers.2"), std::string::npos) << r.err;
  // A different intermediate size: shapes do not match.
  std::string inter = cfg;
  inter.replace(inter.find("\"intermediate_size\": 384"), 24, "\"intermediate_size\": 512");
  write("config.json", inter);
  r = generate();
  EXPECT_EQ(r.code, 4) << r.err;  // a tensor of the wrong shape is corrupt
  EXPECT_NE(error_line(r).find("shape"), std::string::npos) << r.err;
}

TEST_F(BadModel, UnknownArchitectureAndBadTokenizer) {
  write("model.safetensors", weights_);
  std::string cfg = testing::read_file(dir_ + "/config.json");
  std::string gpt = cfg;
  gpt.replace(gpt.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel");
  write("config.json", gpt);
  CliRun r = generate();
  EXPECT_EQ(r.code, 5) << r.err;  // an unknown architecture is unsupported
  EXPECT_NE(error_line(r).find("GPT2LMHeadModel"), std::string::npos) << r.err;
  write("config.json", cfg);
  write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": ");
  r = run_cli("generate --model " + shell_quote(dir_) + " --prompt hi --max-tokens 2");
  EXPECT_EQ(r.code, 4) << r.err;  // a cut tokenizer.json is corrupt
  EXPECT_LT(r.code, 128) << "crashed: " << r.err;
  EXPECT_NE(error_line(r).find("tokenizer.json"), std::string::npos) << r.err;
}

TEST(Cli, TooLongPromptAndBadFlags) {
  std::string ids = "1";
  for (int i = 0; i < 600; ++i) ids += ",5";
  CliRun r = run_cli("generate " + model_arg() + " --prompt-tokens " + ids + " --max-tokens 4");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(error_line(r).find("exceeds the model's context"), std::string::npos) << r.err;
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,99999 --max-tokens 1");
  EXPECT_EQ(r.code, 2) << r.err;  // an id outside the vocabulary is a bad argument
  EXPECT_NE(error_line(r).find("99999"), std::string::npos) << r.err;
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,x");
  EXPECT_EQ(r.code, 2);
  // The prefill kernel flag: v5 / v6 only (on the CPU it has nothing to select, and is accepted).
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,5 --max-tokens 1 --prefill-attention v7");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--prefill-attention"), std::string::npos) << r.err;
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,5 --max-tokens 1 --prefill-attention v5");
  EXPECT_EQ(r.code, 0) << r.err;
  // Numeric checks say the rule and the value (CLI11's own printed a range up to 1.8e308).
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,5 --temperature -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--temperature: must be >= 0, not -1"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 200u) << r.err;
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,5 --max-tokens two");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("'two' is not a finite number"), std::string::npos) << r.err;
  r = run_cli("replay " + model_arg() + " --kv-memory inf --script x.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--kv-memory: 'inf' is not a finite number"), std::string::npos) << r.err;
  r = run_cli("replay " + model_arg() + " --kv-memory 1e12 --script x.json");  // bytes would overflow int64
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--kv-memory: must be at most 1000000 GB, not 1e12"), std::string::npos) << r.err;
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,5 --threads 100000");  // std::thread would throw
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
  r = run_cli("replay " + model_arg() + " --page-size 0 --script x.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--page-size: must be >= 1, not 0"), std::string::npos) << r.err;
  r = run_cli("replay " + model_arg() + " --page-size 100000 --script x.json");  // one page would be 300 MB
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--page-size: must be at most 1024, not 100000"), std::string::npos) << r.err;
}

// Output that cannot be written (stdout on a full disk) is an input/output failure, exit code 1,
// not a silent success with a truncated file.
TEST(Cli, AnUnwritableStdoutFailsTheCommand) {
  ASSERT_TRUE(fs::exists("/dev/full")) << "the test writes to Linux's /dev/full";
  CliRun r = run_cli("generate " + model_arg() + " --prompt-tokens 1,5 --max-tokens 2 --json >/dev/full");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(error_line(r).find("cannot write the output to stdout"), std::string::npos) << r.err;
  r = run_cli("tokenize " + model_arg() + " --text hi >/dev/full");
  EXPECT_EQ(r.code, 1) << r.err;
  // An error of the command itself keeps its own exit code.
  r = run_cli("generate " + model_arg() + " --prompt-tokens 1,99999 --max-tokens 1 >/dev/full");
  EXPECT_EQ(r.code, 2) << r.err;
  r = run_cli("tokenize " + model_arg() + " --text hi >/dev/null");
  EXPECT_EQ(r.code, 0) << r.err;
}

// Flags that would be accepted and then do nothing, or be read differently than written, are refused.
TEST(Cli, FlagsThatWouldDoNothingAreRefused) {
  const std::string gen = "generate " + model_arg() + " --prompt-tokens 1,5 --max-tokens 1";
  const std::string example = shell_quote(testing::source_dir() + "/examples/replay-hotpotqa.json");
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {gen + " --logits", "--logits requires --json"},
           {gen + " --top-p nan", "--top-p: 'nan' is not a finite number"},
           {gen + " --seed -1", "--seed: must be >= 0, not -1"},
           {"demo --threads 100000", "--threads: must be at most 1024"},
           {"demo --threads -3", "--threads: must be >= 0, not -3"},
           {"fidelity " + model_arg() + " --script x.json --kv-memory 1", "--kv-memory"},
           {"fidelity " + model_arg() + " --script x.json --no-decode-lookahead", "--no-decode-lookahead"},
           {"profile-layers " + model_arg() + " --script x.json --recompute-layers 1", "--recompute-layers"},
           {"profile-layers " + model_arg() + " --script x.json --top -5", "--top: must be >= 0, not -5"},
           {"run " + model_arg() + " --question q --system-prompt compact --system-prompt-file x.txt", "excludes"},
           {"replay " + model_arg() + " --script x.json", "register each one the script names with --adapter NAME=DIR"},
           {"fidelity " + model_arg() + " --script " + example, "fidelity compares agents: register at least two"},
           {"profile-layers " + model_arg() + " --script " + example, "profile-layers compares agents"},
       }) {
    const CliRun r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
  }
}

// generate's edges: nothing to generate is finish_reason "length"; an empty --prompt is a prompt
// (BOS alone); the stop token's id is kept but its text is not shown, as vLLM does.
TEST(Cli, GenerateEdges) {
  CliRun r = run_cli("generate " + model_arg() + " --prompt hi --max-tokens 0 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_TRUE(j["output_tokens"].empty());
  r = run_cli("generate " + model_arg() + " --prompt '' --max-tokens 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["prompt_tokens"], nlohmann::json::array({1}));
  // Greedy, this story ends after 135 tokens with the literal text "<|end_story|>" and then EOS
  // (id 2), whose own text is "<|end_story|>" too: shown once, not twice.
  r = run_cli("generate " + model_arg() + " --prompt 'Once upon a time' --max-tokens 300 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["output_tokens"].back(), 2);
  const std::string text = j["text"];
  const std::string end = "find it.<|end_story|>";
  ASSERT_GE(text.size(), end.size());
  EXPECT_EQ(text.substr(text.size() - end.size()), end);
  r = run_cli("generate " + model_arg() + " --prompt 'Once upon a time' --max-tokens 300");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(end + "\n"), std::string::npos) << r.out;  // streamed: the same text
}

// Structured output from the command line, as llama-cli takes it: a GBNF grammar (inline or a
// file), a JSON schema, a regex; the text is in the language and ends at a whole match, the same
// with and without decode lookahead. Bad ones are one error line naming the flag and the cause.
TEST(Cli, GenerateStructuredOutputs) {
  const std::string gbnf = R"(root ::= " " name (" and " name){0,2} ".")" "\n" R"(name ::= "Lily" | "Tom" | "the dog")";
  const std::regex names(" (Lily|Tom|the dog)( and (Lily|Tom|the dog)){0,2}\\.");
  const std::string file = testing::temp_dir("gbnf") + "/names.gbnf";
  std::ofstream(file) << gbnf << "\n";
  nlohmann::json seen;
  for (const std::string& how : {"--grammar " + shell_quote(gbnf), "--grammar-file " + shell_quote(file)}) {
    for (const char* lookahead : {"", " --no-decode-lookahead"}) {
      const CliRun r = run_cli("generate " + model_arg() + " --prompt 'Once upon a time' --max-tokens 30 --temperature 1 "
                               "--seed 4 --json " + how + lookahead);
      ASSERT_EQ(r.code, 0) << r.err;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["finish_reason"], "stop");
      EXPECT_TRUE(std::regex_match(j["text"].get<std::string>(), names)) << j["text"];
      if (seen.is_null()) seen = j["output_tokens"];
      EXPECT_EQ(j["output_tokens"], seen);  // the same picks every way
    }
  }
  const CliRun re = run_cli("generate " + model_arg() + " --prompt 'She was' --max-tokens 30 --regex ' (very )?(happy|sad)\\.'");
  ASSERT_EQ(re.code, 0) << re.err;
  EXPECT_TRUE(std::regex_match(re.out, std::regex(" (very )?(happy|sad)\\.\n"))) << re.out;
  const CliRun schema = run_cli("generate " + model_arg() + " --prompt 'She said' --max-tokens 30 --json "
                                "--json-schema '{\"enum\": [\"yes\", \"no\", \"maybe not\"]}'");
  ASSERT_EQ(schema.code, 0) << schema.err;
  const auto sj = nlohmann::json::parse(schema.out);
  EXPECT_EQ(sj["finish_reason"], "stop");
  const std::string answer = sj["text"];
  EXPECT_TRUE(answer == "\"yes\"" || answer == "\"no\"" || answer == "\"maybe not\"") << answer;

  const CliRun bad = run_cli("generate " + model_arg() + " --prompt hi --grammar 'root ::= nme'");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(error_line(bad), "error: --grammar: grammar: rule 'nme' is used but never defined (line 1, column 10)");
  const CliRun not_json = run_cli("generate " + model_arg() + " --prompt hi --json-schema '{type'");
  EXPECT_EQ(not_json.code, 2);
  EXPECT_NE(error_line(not_json).find("--json-schema: not JSON"), std::string::npos) << not_json.err;
  const CliRun two = run_cli("generate " + model_arg() + " --prompt hi --regex a --grammar 'root ::= \"a\"'");
  EXPECT_EQ(two.code, 2);
  EXPECT_NE(two.err.find("excludes"), std::string::npos) << two.err;
  const CliRun missing = run_cli("generate " + model_arg() + " --prompt hi --grammar-file /nonexistent/x.gbnf");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(error_line(missing).find("/nonexistent/x.gbnf"), std::string::npos) << missing.err;
}

// As vLLM: special tokens are left out of the text (their ids stay in output_tokens) unless
// --keep-special-tokens; generation_config.json's eos ids stop generation too; an empty
// --prompt-tokens is an error, not a BOS-only text prompt.
TEST(Cli, GenerateSpecialTokensEosAndEmptyPrompt) {
  const std::string args = " --prompt 'Once upon a time' --max-tokens 140 --ignore-eos --json";
  CliRun r = run_cli("generate " + model_arg() + args);
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& out = j["output_tokens"];
  ASSERT_NE(std::find(out.begin(), out.end(), 2), out.end()) << "EOS (special) is generated past the story's end";
  auto count = [](const std::string& text) {
    size_t n = 0;
    for (size_t at = text.find("<|end_story|>"); at != std::string::npos; at = text.find("<|end_story|>", at + 1)) ++n;
    return n;
  };
  const std::string skipped = j["text"];
  r = run_cli("generate " + model_arg() + args + " --keep-special-tokens");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string kept = nlohmann::json::parse(r.out)["text"];
  EXPECT_GT(count(kept), count(skipped)) << skipped << "\n---\n" << kept;
  r = run_cli("generate " + model_arg() + " --prompt 'Once upon a time' --max-tokens 140 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, skipped + "\n") << "streamed text is the JSON text";

  // A model directory whose generation_config.json adds the 2nd greedy token as an EOS id.
  r = run_cli("generate " + model_arg() + " --prompt 'Once upon a time' --max-tokens 4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const int second = nlohmann::json::parse(r.out)["output_tokens"][1];
  const std::string dir = testing::temp_dir("gen-config");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(testing::tinystories_dir() + "/" + f, dir + "/" + f);
  std::ofstream(dir + "/generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, )" << second << "]}";
  r = run_cli("generate --model " + shell_quote(dir) + " --prompt 'Once upon a time' --max-tokens 4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["output_tokens"].size(), 2u);
  std::ofstream(dir + "/generation_config.json") << "[1]";
  r = run_cli("generate --model " + shell_quote(dir) + " --prompt hi --max-tokens 1");
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_NE(r.err.find("generation_config.json: top level is not a JSON object"), std::string::npos) << r.err;

  r = run_cli("generate " + model_arg() + " --prompt-tokens '' --max-tokens 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--prompt-tokens is empty"), std::string::npos) << r.err;
}

TEST(Cli, ReplayJsonAndBadScripts) {
  const std::string dir = testing::temp_dir("replay");
  const std::string a = testing::adapters_dir() + "/qv-shared-a-r8/";
  const std::string adapters = " --adapter plan=" + shell_quote(a + "plan") + " --adapter action=" + shell_quote(a + "action");
  std::ofstream(dir + "/s.json") << R"({"steps": [{"append": "Question: where?"}, {"agent": "plan", "generate": 4},
      {"agent": "action", "force_tokens": [5, 38]}]})";
  CliRun r = run_cli("replay " + model_arg() + adapters + " --kv-share base-lr --script " + shell_quote(dir + "/s.json") +
                  " --json --logits");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["steps"].size(), 2u);
  EXPECT_EQ(j["steps"][1]["output_tokens"], nlohmann::json::array({5, 38}));
  EXPECT_EQ(j["steps"][1]["logits"].size(), 2u);
  EXPECT_GT(j["cache"]["base_bytes"].get<int64_t>(), 0);
  std::ofstream(dir + "/bad.json") << R"({"steps": [{"agent": "plan"}]})";
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/bad.json"));
  EXPECT_EQ(r.code, 4) << r.err;  // a step without an action is a corrupt script
  EXPECT_NE(error_line(r).find("bad.json"), std::string::npos) << r.err;
  // One action per step; a second action or an unknown key is refused, not dropped.
  for (const std::string& step : {std::string(R"({"append": "hi", "agent": "plan", "generate": 3})"),
                                  std::string(R"({"agent": "plan", "generate": 3, "force_tokens": [5]})"),
                                  std::string(R"({"agent": "plan", "generate": 3, "bogus": 1})")}) {
    std::ofstream(dir + "/two.json") << R"({"steps": [)" << step << "]}";
    r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/two.json"));
    EXPECT_EQ(r.code, 4) << step;
    EXPECT_NE(error_line(r).find("two.json: step 0: "), std::string::npos) << step << ": " << r.err;
  }
  std::ofstream(dir + "/annotated.json") << R"({"steps": [{"append": "hi", "label": "question", "round": 0},
      {"agent": "plan", "generate": 2, "comment": "first thought"}]})";
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/annotated.json"));
  EXPECT_EQ(r.code, 0) << r.err;
  std::ofstream(dir + "/broken.json") << "{\"steps\": [\n  {\"append\": }]}";
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/broken.json"));
  EXPECT_EQ(r.code, 4);
  EXPECT_NE(error_line(r).find("broken.json: invalid JSON (parse error at line 2"), std::string::npos) << r.err;
  std::ofstream(dir + "/empty.json") << "";
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/empty.json"));
  EXPECT_EQ(r.code, 4) << "an empty file is there but is not a script: " << r.err;
  std::ofstream(dir + "/long.json") << R"({"steps": [{"append": "hi"}, {"agent": "plan", "generate": 100000}]})";
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/long.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(error_line(r).find("long.json: step 1: context of 513 tokens exceeds the model's max_position_embeddings (512)"),
            std::string::npos)
      << r.err;
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/absent.json"));
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(error_line(r).find("absent.json: file not found"), std::string::npos) << r.err;
  // droidspeak without --recompute-layers recomputes layer 0, as fidelity, demo and bench do;
  // before, it silently ran as full.
  auto cache_total = [&](const std::string& mode) {
    const CliRun m = run_cli("replay " + model_arg() + adapters + " --kv-share " + mode + " --json --script " +
                             shell_quote(dir + "/s.json"));
    EXPECT_EQ(m.code, 0) << mode << ": " << m.err;
    return m.code == 0 ? nlohmann::json::parse(m.out)["cache"]["total_bytes"].get<int64_t>() : -1;
  };
  const int64_t droid = cache_total("droidspeak");
  EXPECT_EQ(droid, cache_total("droidspeak --recompute-layers 0"));
  EXPECT_GT(droid, cache_total("full"));
  std::ofstream(dir + "/noname.json") << R"({"steps": [{"agent": "", "generate": 2}]})";
  r = run_cli("replay " + model_arg() + adapters + " --script " + shell_quote(dir + "/noname.json"));
  EXPECT_EQ(r.code, 4);
  EXPECT_NE(error_line(r).find("noname.json: step 0: \"agent\" must be a non-empty string"), std::string::npos) << r.err;
  const std::string indep = testing::adapters_dir() + "/qv-indep-a-r8/";
  r = run_cli("replay " + model_arg() + " --adapter plan=" + shell_quote(indep + "plan") + " --adapter action=" +
              shell_quote(indep + "action") + " --kv-share base-lr --script " + shell_quote(dir + "/s.json"));
  EXPECT_EQ(r.code, 2) << r.err;  // independent A under base-lr is a bad argument
  // ... of the flags: the script's path does not lead the line.
  EXPECT_EQ(error_line(r).find("error: --kv-share base-lr needs shared-A adapters"), 0u) << r.err;
  r = run_cli("replay " + model_arg() + adapters + " --kv-share droidspeak --recompute-layers 9 --script " +
              shell_quote(dir + "/s.json"));
  EXPECT_EQ(r.code, 2) << r.err;  // a layer the model lacks is a bad argument
  EXPECT_EQ(error_line(r).find("error: --recompute-layers: layer 9 is out of range"), 0u) << r.err;
  r = run_cli("replay " + model_arg() + adapters + " --kv-share droidspeak --recompute-layers 1,0,1 --script " +
              shell_quote(dir + "/s.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(error_line(r).find("--recompute-layers: layer 1 is listed twice"), std::string::npos) << r.err;
  // --kv-memory: one KV arena of that size for every cache; too small is an OOM naming who holds it.
  r = run_cli("replay " + model_arg() + adapters + " --kv-share base-lr --kv-memory 0.001 --json --script " +
              shell_quote(dir + "/s.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const int64_t reserved = nlohmann::json::parse(r.out)["cache"]["reserved_bytes"].get<int64_t>();
  EXPECT_LE(reserved, 1000000);
  EXPECT_GE(reserved, 900000);
  r = run_cli("replay " + model_arg() + adapters + " --kv-share base-lr --kv-memory 0.00001 --script " +
              shell_quote(dir + "/s.json"));
  EXPECT_EQ(r.code, 6) << r.err;  // out of memory
  EXPECT_NE(error_line(r).find("exhausted"), std::string::npos) << r.err;
  EXPECT_NE(error_line(r).find("free of"), std::string::npos) << r.err;
}

// --kv-memory too small for both agents' private caches (none): the least recently run agent's are
// dropped and recomputed at its next call (reported in the JSON and the text summary);
// --no-kv-evict turns the same run into an out-of-memory error.
TEST(Cli, ReplayEvictsPrivateCachesWhenTheKvMemoryIsFull) {
  const std::string dir = testing::temp_dir("replay-evict");
  const std::string a = testing::adapters_dir() + "/qv-shared-a-r8/";
  const std::string adapters = " --adapter plan=" + shell_quote(a + "plan") + " --adapter action=" + shell_quote(a + "action");
  std::ofstream(dir + "/s.json") << R"({"steps": [
      {"append": "Once upon a time there was a little girl who liked to play in the park with her dog."},
      {"agent": "plan", "generate": 6}, {"append": " The dog ran to the tree and the girl ran after it."},
      {"agent": "action", "generate": 6}, {"agent": "plan", "generate": 4}]})";
  const std::string base = "replay " + model_arg() + adapters + " --kv-share none --script " + shell_quote(dir + "/s.json");
  CliRun r = run_cli(base + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto free_run = nlohmann::json::parse(r.out);
  EXPECT_EQ(free_run["evictions"], 0);
  r = run_cli(base + " --json --kv-memory 0.00005");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["evictions"].get<int64_t>(), 0);
  EXPECT_GT(j["evicted_tokens"].get<int64_t>(), 0);
  ASSERT_EQ(j["steps"].size(), 3u);
  EXPECT_GT(j["steps"][2]["prefilled_tokens"].get<int64_t>(), free_run["steps"][2]["prefilled_tokens"].get<int64_t>())
      << "plan recomputes the context its dropped cache held";
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(j["steps"][i]["output_tokens"], free_run["steps"][i]["output_tokens"]) << "step " << i;
  EXPECT_LE(j["cache_peak"]["allocated_bytes"].get<int64_t>(), j["cache"]["reserved_bytes"].get<int64_t>());
  r = run_cli(base + " --kv-memory 0.00005");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("KV memory full:"), std::string::npos) << r.out;
  r = run_cli(base + " --kv-memory 0.00005 --no-kv-evict");
  EXPECT_EQ(r.code, 6) << r.err;
  EXPECT_NE(error_line(r).find("exhausted"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lragent
