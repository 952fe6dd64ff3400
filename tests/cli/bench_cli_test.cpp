// `lragent bench trace` end to end on the tiny preset (CPU): all five modes reported with the
// sharing relations, JSON / markdown / trace files written, a --kv-budget evicting private caches
// or (--no-kv-evict) giving OOM cells (exit 0, JSON still written), and bad flags giving one error line.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_util.h"

namespace lragent {
namespace {

using testing::CliRun;
using testing::shell_quote;

// Fails with a pointer to the fix while main.cpp does not register the command.
CliRun run_bench(const std::string& args) {
  const CliRun r = testing::run_lragent("bench trace " + args);
  // CLI11's answers when no subcommand named `bench` exists.
  const bool unknown = r.err.find("A subcommand is required") != std::string::npos ||
                       r.err.find("not expected") != std::string::npos;
  EXPECT_FALSE(unknown) << "`bench` is not registered: main.cpp must call lragent::cli::register_bench(app, action)";
  return r;
}

std::map<std::string, nlohmann::json> cells_by_key(const nlohmann::json& j) {
  std::map<std::string, nlohmann::json> out;
  for (const auto& c : j["cells"]) out[std::to_string(c["length"].get<int64_t>()) + "/" + c["mode"].get<std::string>()] = c;
  return out;
}

TEST(BenchTraceCli, TinyPresetAllModes) {
  const std::string dir = testing::temp_dir("bench-trace");
  const std::string json = dir + "/bench.json", md = dir + "/bench.md";
  const CliRun r = run_bench("--preset tiny --lengths 300,600 --agents-curve --max-agents 4 --json " + shell_quote(json) +
                             " --markdown " + shell_quote(md));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| tokens | none TTFT s |"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("10/10 cells"), std::string::npos) << "progress on stderr: " << r.err;
  const auto j = nlohmann::json::parse(testing::read_file(json));
  EXPECT_EQ(j["complete"], true) << "the file is rewritten per cell; the last write marks it complete";
  EXPECT_EQ(j["modes"], nlohmann::json({"none", "full", "droidspeak", "base", "base-lr"}));
  ASSERT_EQ(j["cells"].size(), 10u);
  auto cells = cells_by_key(j);
  for (const auto& [key, c] : cells) {
    EXPECT_EQ(c["status"], "ok") << key;
    EXPECT_EQ(c["final_tokens"], c["length"]) << key;
    EXPECT_GT(c["ttft_s"].get<double>(), 0) << key;
    EXPECT_GT(c["throughput_tok_s"].get<double>(), 0) << key;
    EXPECT_GT(c["decode_tok_s"].get<double>(), 0) << key;
    EXPECT_EQ(c["kv_bytes"], c["cache_bytes"]["total"]) << key;
  }
  for (const char* len : {"300", "600"}) {
    const auto& none = cells[std::string(len) + "/none"];
    const auto& blr = cells[std::string(len) + "/base-lr"];
    EXPECT_LT(blr["computed_tokens"].get<int64_t>(), none["computed_tokens"].get<int64_t>()) << len;
    EXPECT_LT(blr["kv_bytes"].get<int64_t>(), none["kv_bytes"].get<int64_t>()) << len;
    EXPECT_EQ(none["cache_bytes"]["base"], 0);
    EXPECT_GT(blr["cache_bytes"]["lr"].get<int64_t>(), 0);
  }
  const auto& curve = j["agents_curve"];
  EXPECT_EQ(curve["length"], 600);
  ASSERT_EQ(curve["modes"]["none"].size(), 4u);
  EXPECT_EQ(curve["modes"]["none"][3]["total"].get<int64_t>(), 4 * curve["modes"]["none"][0]["total"].get<int64_t>());
  EXPECT_EQ(curve["modes"]["base-lr"][3]["total"], curve["modes"]["base-lr"][0]["total"]);
  EXPECT_EQ(j["preset"]["name"], "tiny");
  EXPECT_EQ(j["trace"]["trajectory_id"], "70b_hotpotqa_200.json#0");
  const std::string table = testing::read_file(md);
  EXPECT_NE(table.find("| 600 |"), std::string::npos) << table;
}

// Every cell is warmed up untimed (one run by default) and may be timed several times: the
// reported figures are those of the run of median wall time, and every run's wall time is kept.
TEST(BenchTraceCli, WarmupAndRepeatedRunsReportTheMedian) {
  const std::string dir = testing::temp_dir("bench-trace-runs");
  const std::string json = dir + "/bench.json";
  const CliRun r = run_bench("--preset tiny --lengths 300 --modes none,base-lr --runs 3 --warmup-runs 2 --json " +
                             shell_quote(json));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(testing::read_file(json));
  EXPECT_EQ(j["warmup_runs_per_cell"], 2);
  EXPECT_EQ(j["timed_runs_per_cell"], 3);
  ASSERT_EQ(j["cells"].size(), 2u);
  for (const auto& c : j["cells"]) {
    EXPECT_EQ(c["warmup_runs"], 2);
    ASSERT_EQ(c["wall_s_runs"].size(), 3u);
    std::vector<double> walls = c["wall_s_runs"].get<std::vector<double>>();
    std::sort(walls.begin(), walls.end());
    EXPECT_EQ(c["wall_s"].get<double>(), walls[1]) << "the median run's figures";
  }
  const CliRun cold = run_bench("--preset tiny --lengths 300 --modes none --no-warmup --json " + shell_quote(json));
  ASSERT_EQ(cold.code, 0) << cold.err;
  const auto k = nlohmann::json::parse(testing::read_file(json));
  EXPECT_EQ(k["warmup_runs_per_cell"], 0);
  EXPECT_EQ(k["cells"][0]["warmup_runs"], 0);
  EXPECT_FALSE(k["cells"][0].contains("wall_s_runs")) << "one timed run";
}

TEST(BenchTraceCli, TooSmallKvBudgetReportsOomAndStillWritesJson) {
  const std::string json = testing::temp_dir("bench-oom") + "/bench.json";
  const CliRun r = run_bench("--preset tiny --lengths 300,600 --kv-budget 0.0004 --no-kv-evict --json " + shell_quote(json));
  ASSERT_EQ(r.code, 0) << "OOM cells are results, not failures: " << r.err;
  EXPECT_NE(r.out.find("OOM"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(testing::read_file(json));
  EXPECT_EQ(j["kv_budget_gb"], 0.0004);
  EXPECT_EQ(j["kv_evict"], false);
  auto cells = cells_by_key(j);
  ASSERT_EQ(cells.size(), 10u);
  EXPECT_EQ(cells["600/none"]["status"], "oom");
  EXPECT_NE(cells["600/none"]["message"].get<std::string>().find("exhausted"), std::string::npos);
  EXPECT_EQ(cells["600/base-lr"]["status"], "ok") << "base-lr fits where none does not";
}

TEST(BenchTraceCli, KvBudgetEvictsByDefault) {
  const std::string json = testing::temp_dir("bench-evict") + "/bench.json";
  const CliRun r = run_bench("--preset tiny --lengths 600 --modes none,base-lr --kv-budget 0.0004 --json " + shell_quote(json));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(testing::read_file(json));
  EXPECT_EQ(j["kv_evict"], true);
  auto cells = cells_by_key(j);
  EXPECT_EQ(cells["600/none"]["status"], "ok") << cells["600/none"].dump();
  EXPECT_GT(cells["600/none"]["evictions"].get<int64_t>(), 0);
  EXPECT_EQ(cells["600/base-lr"]["evictions"], 0);
}

TEST(BenchTraceCli, DumpTracesForThePeer) {
  const std::string file = testing::temp_dir("bench-dump") + "/traces.json";
  const CliRun r = run_bench("--preset llama3.1-8b --lengths 1.9k,3000 --dump-traces " + shell_quote(file) + " --dump-only");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(testing::read_file(file));
  EXPECT_EQ(j["preset"]["hidden_size"], 4096);
  EXPECT_EQ(j["preset"]["bos_token_id"], 128000);
  ASSERT_EQ(j["traces"].size(), 2u);
  for (const auto& t : j["traces"]) {
    int64_t n = 1;  // BOS
    for (const auto& s : t["steps"]) n += s.contains("append_tokens") ? static_cast<int64_t>(s["append_tokens"].size()) : s["generate"].get<int64_t>();
    EXPECT_EQ(n, t["target_tokens"].get<int64_t>());
  }
  EXPECT_EQ(j["traces"][0]["target_tokens"], 1900);
}

TEST(BenchTraceCli, BadFlagsGiveOneErrorLine) {
  for (const std::string& args : {std::string("--lengths 3x"), std::string("--preset gpt5"), std::string("--modes none,all"),
                                  std::string("--lengths 10"), std::string("--adapters both"),
                                  std::string("--trajectories /nonexistent.json")}) {
    const CliRun r = run_bench(args);
    EXPECT_GE(r.code, 2) << args;
    EXPECT_LE(r.code, 3) << args;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  // Checked before any model is built, naming this command's own flags.
  struct Case {
    std::string args, says;
    int code;
  };
  for (const Case& c : std::vector<Case>{
           {"--modes none,bogus", "--modes: 'bogus' is not a sharing mode", 2},
           {"--droidspeak-layers 9", "--droidspeak-layers: layer 9 is out of range; the tiny preset has 2 layers", 2},
           {"--droidspeak-layers 1,1", "--droidspeak-layers: layer 1 is listed twice", 2},
           {"--dump-only", "--dump-only requires --dump-traces", 2},
           {"--json /nonexistent-dir/x.json", "--json /nonexistent-dir/x.json: cannot write there", 1},
           {"--curve-length -5", "--curve-length: must be >= 0, not -5", 2},
       }) {
    const CliRun r = run_bench(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.find("bench trace:"), std::string::npos) << c.args << ": no model is built first: " << r.err;
  }
}

}  // namespace
}  // namespace lragent
