// `lragent serve` as a process: --kv-share auto picks base when the adapters do not share A,
// SIGINT/SIGTERM stop it cleanly, a port it cannot listen on is one error line, and the start-up
// line names the chat route only with a chat template; a second signal quits at once; on Qwen3 auto
// picks none for an adapter that adapts k_proj.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "test_util.h"

namespace lragent {
namespace {

using testing::shell_quote;

std::string adapters(const std::string& set) {
  std::string a;
  for (const char* role : {"plan", "action", "reflect"})
    a += " --adapter " + std::string(role) + "=" + shell_quote(testing::adapters_dir() + "/" + set + "/" + role);
  return a;
}

// Runs serve under `timeout -s SIGNAL SECONDS`: the server must stop on the signal by itself.
// `env`: VAR=VALUE assignments for its environment.
testing::CliRun serve_until(const std::string& signal, int seconds, const std::string& args, const std::string& env = "") {
  testing::CliRun r;
  const std::string err_file = testing::temp_dir("serve-cli") + "/err.txt";
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + "timeout --preserve-status -k 10 -s " + signal + " " + std::to_string(seconds) + " " +
                          shell_quote(testing::lragent_bin()) + " serve " + args + " 2>" + shell_quote(err_file);
  const int status = std::system(cmd.c_str());
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = testing::read_file(err_file);
  return r;
}

TEST(ServeCli, AutoSharingFallsBackToBaseAndSignalsStopTheServer) {
  const std::string model = "--model " + shell_quote(testing::tinystories_dir());
  auto r = serve_until("INT", 6, model + adapters("qv-indep-a-r8") + " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;  // stopped by SIGINT, not killed (timeout would give 124 or 137)
  EXPECT_NE(r.err.find("do not share lora_A"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kv-share base,"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/v1/completions; kv-share"), std::string::npos) << r.err;  // no chat template: no chat route
  EXPECT_NE(r.err.find("stopped"), std::string::npos) << r.err;
  r = serve_until("TERM", 6, model + adapters("qv-shared-a-r8") + " --port 0 --served-model-name tiny tiny-2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("serving tiny (also as tiny-2), plan, action, reflect"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kv-share base-lr,"), std::string::npos) << r.err;
}

// vLLM's command line serves as is: the model as the first argument, --enable-lora, the adapters
// as --lora-modules (NAME=DIR or its JSON form, several after one flag), --enable-auto-tool-choice.
TEST(ServeCli, VllmsCommandLineServes) {
  const std::string dir = testing::adapters_dir() + "/qv-shared-a-r8/";
  const nlohmann::json reflect = {{"name", "reflect"}, {"path", dir + "reflect"}};
  // The model as a directory whose generation_config.json recommends sampling defaults (its files
  // linked from the fixture's).
  const std::string model_dir = testing::temp_dir("serve-gen-config") + "/tinystories-656k";
  std::filesystem::create_directories(model_dir);
  for (const auto& e : std::filesystem::directory_iterator(testing::tinystories_dir()))
    if (e.path().filename() != "generation_config.json")
      std::filesystem::create_symlink(e.path(), model_dir + "/" + e.path().filename().string());
  std::ofstream(model_dir + "/generation_config.json") << R"({"temperature": 0.6, "top_p": 0.9, "top_k": 50, "eos_token_id": 2})";
  auto r = serve_until("INT", 6, shell_quote(model_dir) + " --enable-lora --lora-modules plan=" +
                                     shell_quote(dir + "plan") + " action=" + shell_quote(dir + "action") + " " +
                                     shell_quote(reflect.dump()) +
                                     " --enable-auto-tool-choice --tool-call-parser pythonic --dtype auto --trust-remote-code"
                                     " --tensor-parallel-size 1 --enable-prefix-caching --disable-log-requests --seed 0"
                                     " --max-loras 4 --max-cpu-loras 8 --enable-chunked-prefill --disable-log-stats"
                                     " --kv-cache-dtype auto --block-size 16"
                                     " --allowed-origins '[\"https://app.example\"]' --allowed-methods GET,POST"
                                     " --allowed-headers '[\"*\"]' --allow-credentials --trust-request-chat-template"
                                     " --override-generation-config '{\"max_new_tokens\": 64}' --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("serving tinystories-656k, plan, action, reflect"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("runtime LoRA updating is on"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("default sampling parameters from the generation config: temperature=0.6, top_p=0.9, max_tokens=64"),
            std::string::npos)
      << r.err;
  // vLLM turns runtime LoRA updating on from the environment; --enable-runtime-lora says the same.
  r = serve_until("INT", 4, shell_quote(testing::tinystories_dir()) + " --port 0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("runtime LoRA updating is on: POST /v1/load_lora_adapter"), std::string::npos) << r.err;
  // Its errors: the model twice, a JSON form without its path, an adapter above --max-lora-rank
  // (these are rank 8: 8 serves, 4 is refused naming the adapter).
  auto low = testing::run_lragent("serve " + shell_quote(testing::tinystories_dir()) + " --max-lora-rank 4 --lora-modules plan=" +
                                  shell_quote(dir + "plan"));
  EXPECT_EQ(low.code, 2) << low.err;
  EXPECT_NE(low.err.find("adapter 'plan' has LoRA rank 8, more than --max-lora-rank 4"), std::string::npos) << low.err;
  r = serve_until("INT", 4, shell_quote(testing::tinystories_dir()) + " --max-lora-rank 8 --lora-modules plan=" +
                                shell_quote(dir + "plan") + " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("serving tinystories-656k, plan"), std::string::npos) << r.err;
  auto twice = testing::run_lragent("serve " + shell_quote(testing::tinystories_dir()) + " --model " +
                                    shell_quote(testing::tinystories_dir()));
  EXPECT_EQ(twice.code, 2) << twice.err;
  auto bad = testing::run_lragent("serve --port 0 --lora-modules '{\"name\": \"plan\"}'");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("expected NAME=DIR or {\"name\": NAME, \"path\": DIR}"), std::string::npos) << bad.err;
  // vLLM flags lragent cannot honour, and bad generation configs, stop it before the model loads.
  const std::string model = "serve " + shell_quote(testing::tinystories_dir()) + " --port 0";
  for (const auto& [args, code, says] : std::vector<std::tuple<std::string, int, std::string>>{
           {" --tensor-parallel-size 2", 2, "--tensor-parallel-size"},
           {" --dtype half", 2, "--dtype"},
           {" --kv-cache-dtype fp8", 2, "--kv-cache-dtype"},
           {" --max-loras 0", 2, "--max-loras"},
           {" --override-generation-config '{temperature'", 2, "--override-generation-config is not valid JSON"},
           {" --override-generation-config '{\"top_p\": 0}'", 2, "'top_p' = 0 must be in (0, 1]"},
           {" --generation-config /nonexistent", 3, "--generation-config /nonexistent: no generation_config.json there"},
           {" --allowed-origins '[\"https://a.example\", 2]'", 2, "--allowed-origins: '[\"https://a.example\", 2]' is not a JSON list of strings"},
       }) {
    auto e = testing::run_lragent(model + args);
    EXPECT_EQ(e.code, code) << args << ": " << e.err;
    EXPECT_NE(e.err.find(says), std::string::npos) << args << ": " << e.err;
  }
}

// A KV memory given in GB (--kv-cache-memory) is one pool the trajectories share, as the one
// --gpu-memory-utilization sizes on a GPU: the other defaults are vLLM's then too (256
// trajectories, the model's whole context), and given values win. Reserved (no size given), 4.
TEST(ServeCli, AKvCacheMemoryTakesVllmsDefaults) {
  const std::string model = "--model " + shell_quote(testing::tinystories_dir()) + adapters("qv-shared-a-r8");
  auto r = serve_until("INT", 6, model + " --port 0 --kv-cache-memory 0.05");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("up to 256 trajectories of 512 tokens, KV memory 0.05 GB"), std::string::npos) << r.err;
  r = serve_until("INT", 6, model + " --port 0 --kv-cache-memory 0.05 --max-context 300 --max-num-seqs 7");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("up to 7 trajectories of 300 tokens"), std::string::npos) << r.err;
  r = serve_until("INT", 6, model + " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("up to 4 trajectories of 512 tokens"), std::string::npos) << r.err;
}

// Qwen3 norms every key (k_norm), so an adapter that adapts k_proj cannot keep that term in
// low-rank form: auto picks none for it and says why, q/v adapters keep base-lr, and an explicit
// base-lr with the k_proj adapter is one error line naming it.
TEST(ServeCli, AutoSharingOnQwen3PicksNoneForAKProjAdapter) {
  const std::string model = "--model " + shell_quote(testing::fixtures_dir() + "/models/synthetic-qwen3");
  const std::string dir = testing::fixtures_dir() + "/adapters/synthetic-qwen3/";
  const std::string qkvo = " --adapter qkvo=" + shell_quote(dir + "qkvo"), qv = " --adapter qv=" + shell_quote(dir + "qv");
  auto r = serve_until("INT", 6, model + qv + qkvo + " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--kv-share auto: Qwen3ForCausalLM norms its keys and an adapter adapts k_proj"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("kv-share none,"), std::string::npos) << r.err;
  r = serve_until("INT", 6, model + qv + " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("norms its keys"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kv-share base-lr,"), std::string::npos) << r.err;
  r = serve_until("INT", 6, model + qkvo + " --kv-share base-lr --port 0");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--kv-share base-lr keeps k_proj's LoRA term in low-rank form"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("adapter 'qkvo' adapts k_proj"), std::string::npos) << r.err;
}

// The chat template comes from chat_template.jinja beside the model (transformers >= 4.43 saves it
// there), or beside --tokenizer's tokenizer, or --chat-template (a file or the text); a --chat-template that cannot be used stops
// start-up with one error line.
TEST(ServeCli, ChatTemplatesFromTheModelDirectoryOrTheFlag) {
  const std::string cfg_path = testing::fetched_fixtures_dir() + "/llama3/tokenizer_config.json";
  // An npm tokenizer fixture: a skip only where scripts/test.sh does not require the fixtures.
  if (!std::filesystem::exists(cfg_path)) LRAGENT_SKIP_UNLESS_REQUIRED(cfg_path << " missing: run scripts/fetch-fixtures.sh");
  const std::string llama3 = nlohmann::json::parse(testing::read_file(cfg_path))["chat_template"];
  const std::string dir = testing::temp_dir("serve-chat-model");
  for (const auto& e : std::filesystem::directory_iterator(testing::tinystories_dir()))
    std::filesystem::copy(e.path(), dir + "/" + e.path().filename().string());
  std::ofstream(dir + "/chat_template.jinja") << llama3;
  auto r = serve_until("INT", 6, "--model " + shell_quote(dir) + " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: llama3 (" + dir + "/chat_template.jinja)"), std::string::npos) << r.err;
  // The start-up line names the chat route only when there is a template to serve it.
  EXPECT_NE(r.err.find("/v1/completions, /v1/chat/completions, /v1/responses, /v1/messages;"), std::string::npos) << r.err;

  // --tokenizer DIR: the tokenizer and its template from there (as vLLM reads the template from
  // the tokenizer), the weights from the model directory.
  r = serve_until("INT", 6, "--model " + shell_quote(testing::tinystories_dir()) + " --tokenizer " + shell_quote(dir) +
                                " --port 0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: llama3 (" + dir + "/chat_template.jinja)"), std::string::npos) << r.err;

  const std::string model = "--model " + shell_quote(testing::tinystories_dir());
  r = serve_until("INT", 6, model + " --port 0 --chat-template " + shell_quote(llama3));  // the text itself
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: llama3 (--chat-template)"), std::string::npos) << r.err;
  auto missing = testing::run_lragent("serve " + model + " --chat-template /no/such/template.jinja");
  EXPECT_EQ(missing.code, 3) << missing.err;
  EXPECT_NE(missing.err.find("--chat-template /no/such/template.jinja"), std::string::npos) << missing.err;
  // Any other template is interpreted; one that cannot be parsed stops start-up, saying where.
  std::ofstream(dir + "/other.jinja") << "{{ messages[0]['content'] }}";
  r = serve_until("INT", 6, model + " --port 0 --chat-template " + shell_quote(dir + "/other.jinja"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: jinja (" + dir + "/other.jinja); tool calls: hermes"), std::string::npos) << r.err;
  // The tool-call form follows the template unless --tool-call-parser names one; a parser lragent
  // lacks is a bad flag (exit 2) naming the ones it has.
  r = serve_until("INT", 6, model + " --port 0 --chat-template " + shell_quote(dir + "/other.jinja") +
                                " --tool-call-parser mistral --reasoning-parser qwen3");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tool calls: mistral (--tool-call-parser)"), std::string::npos) << r.err;
  for (const std::string flag : {"--tool-call-parser internlm", "--reasoning-parser granite"}) {
    auto bad = testing::run_lragent("serve " + model + " " + flag);
    EXPECT_EQ(bad.code, 2) << flag << ": " << bad.err;
    EXPECT_NE(bad.err.find(flag.substr(0, flag.find(' '))), std::string::npos) << bad.err;
  }
  std::ofstream(dir + "/broken.jinja") << "{{ messages[0]['content'] }";
  auto broken = testing::run_lragent("serve " + model + " --chat-template " + shell_quote(dir + "/broken.jinja"));
  EXPECT_EQ(broken.code, 4) << broken.err;  // kCorrupt
  EXPECT_NE(broken.err.find("its chat_template cannot be used"), std::string::npos) << broken.err;
  EXPECT_NE(broken.err.find("line 1"), std::string::npos) << broken.err;
}

// One SIGINT lets the requests in flight finish, and a client that stalls mid-body holds the exit
// for the HTTP read timeout (5 s); a second SIGINT quits at once with 130, as uvicorn does. (The
// other tests stop serve with `timeout`, which delivers its signal twice at once: a repeat within
// 300 ms is not a second Ctrl-C, and they still see the graceful stop.)
TEST(ServeCli, ASecondSignalQuitsAtOnce) {
  const std::string dir = testing::temp_dir("serve-signals");
  const std::string script = dir + "/run.sh";
  std::ofstream(script) << R"(set -u
"$1" serve --port 0 2>"$2/err" & pid=$!
for i in $(seq 300); do grep -q 'serving' "$2/err" && break; sleep 0.1; done
port=$(grep -o '127.0.0.1:[0-9]*' "$2/err" | head -1 | cut -d: -f2)
exec 3<>/dev/tcp/127.0.0.1/$port
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{' >&3
sleep 0.3
kill -INT $pid
sleep 0.6
t0=$(date +%s%N)
kill -INT $pid
wait $pid
echo "exit $? after $(( ($(date +%s%N) - t0) / 1000000 )) ms" >"$2/out"
)";
  const std::string cmd = "bash " + shell_quote(script) + " " + shell_quote(testing::lragent_bin()) + " " + shell_quote(dir);
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string err = testing::read_file(dir + "/err"), out = testing::read_file(dir + "/out");
  EXPECT_NE(err.find("stopping: finishing the requests in flight (Ctrl-C again quits at once)"), std::string::npos) << err;
  EXPECT_NE(err.find("quit with requests in flight"), std::string::npos) << err;
  ASSERT_EQ(out.rfind("exit 130 after ", 0), 0u) << out << err;
  EXPECT_LT(std::stoi(out.substr(15)), 2000) << out;  // not the stalled client's 5 s
}

TEST(ServeCli, APortInUseAndBadFlagsAreOneErrorLine) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  auto r = testing::run_lragent("serve --port " + std::to_string(port));
  ::close(fd);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << r.err;
  r = testing::run_lragent("serve --port 70000");
  EXPECT_EQ(r.code, 2) << r.err;
  r = testing::run_lragent("serve --kv-share everything");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--kv-share"), std::string::npos) << r.err;
  // The choices it lists include serve's own default.
  EXPECT_NE(r.err.find("choose auto, none, full, base, base-lr, droidspeak or icarus"), std::string::npos) << r.err;
  // One KV memory for the server and one per trajectory do not go together.
  for (const char* other : {"--no-share-blocks", "--kv-memory 1"}) {
    r = testing::run_lragent(std::string("serve --port 0 --kv-cache-memory 1 ") + other);
    EXPECT_EQ(r.code, 2) << other << ": " << r.err;
    EXPECT_NE(r.err.find("--kv-cache-memory sizes the one KV memory every trajectory shares"), std::string::npos)
        << r.err;
  }
  r = testing::run_lragent("serve --kv-cache-memory -1");
  EXPECT_EQ(r.code, 2) << r.err;
  // vLLM's name for --max-sessions is the same option.
  r = testing::run_lragent("serve --max-num-seqs -1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--max-sessions: must be >= 0, not -1"), std::string::npos) << r.err;
  r = testing::run_lragent("serve --port 0 --kv-cache-memory 1 --gpu-memory-utilization 0.9");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("both size the server's KV memory"), std::string::npos) << r.err;
  r = testing::run_lragent("serve --port 0 --gpu-memory-utilization 1.5");
  EXPECT_EQ(r.code, 2) << r.err;
  // On the CPU there is no device memory to take a fraction of: the error says what to use.
  r = testing::run_lragent("serve --port 0 --gpu-memory-utilization 0.9");
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_NE(r.err.find("--gpu-memory-utilization: a GPU memory utilization needs a device with its own memory"),
            std::string::npos) << r.err;
}

}  // namespace
}  // namespace lragent
