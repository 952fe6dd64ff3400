// vLLM's runtime LoRA updating over HTTP (POST /v1/load_lora_adapter, /v1/unload_lora_adapter,
// server_lora.cpp): an adapter loaded while the server runs answers as one served from the start,
// reading the cache the other agents wrote; unloaded, it is gone from /v1/models and requests,
// while a request running on it finishes; bad loads are refused with their cause and the server
// keeps serving.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/openai_api.h"

#include "server/server_fixture.h"
#include "test_util.h"

namespace lragent::server {
namespace {

class RuntimeLoraTest : public ServerTest {
 protected:
  static std::string role_dir(const std::string& set, const std::string& role) {
    return testing::adapters_dir() + "/" + set + "/" + role;
  }
  std::pair<int, json> load(const std::string& name, const std::string& dir) {
    return post("/v1/load_lora_adapter", json{{"lora_name", name}, {"lora_path", dir}});
  }
  std::pair<int, json> unload(const std::string& name) {
    return post("/v1/unload_lora_adapter", json{{"lora_name", name}});
  }
  std::vector<std::string> models() {
    auto r = httplib::Client("127.0.0.1", port_).Get("/v1/models");
    std::vector<std::string> out;
    if (!r) return out;
    const json list = json::parse(r->body);
    for (const json& m : list["data"]) out.push_back(m["id"]);
    return out;
  }
  std::pair<int, json> greedy(const std::string& model, const std::string& prompt, int max_tokens = 8) {
    return complete({{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}});
  }
  static std::string text(const json& j) { return j["choices"][0]["text"].get<std::string>(); }
};

// In base-lr (reflect shares plan's low-rank cache) and none (it computes its own): plan writes a
// turn, reflect is loaded, and its answer and what it computed (the lragent block's prefilled and
// reused tokens) are those of a server that served reflect from the start; it is refused twice;
// unloaded, it is a 404 and gone from /v1/models; loaded again, it answers the same.
TEST_F(RuntimeLoraTest, AnAdapterLoadedLaterAnswersAsOneServedFromTheStart) {
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    start(mode);
    auto [s1, plan_ref] = greedy("plan", prompt);
    ASSERT_EQ(s1, 200) << plan_ref.dump();
    const std::string turn = prompt + text(plan_ref) + " Then";
    auto [s2, reflect_ref] = greedy("reflect", turn);
    ASSERT_EQ(s2, 200) << reflect_ref.dump();
    stop();

    ASSERT_NE(reg_.remove("reflect"), nullptr);
    ServerOptions o;
    o.runtime_lora = true;
    start(mode, o);
    EXPECT_EQ(models(), (std::vector<std::string>{"tiny", "plan", "action"}));
    auto [s3, plan_got] = greedy("plan", prompt);
    ASSERT_EQ(s3, 200);
    EXPECT_EQ(text(plan_got), text(plan_ref));
    EXPECT_EQ(greedy("reflect", turn).first, 404);

    auto [ls, lbody] = load("reflect", role_dir("qv-shared-a-r8", "reflect"));
    ASSERT_EQ(ls, 200) << lbody.dump();
    EXPECT_EQ(lbody, "Success: LoRA adapter 'reflect' added successfully.");
    EXPECT_EQ(models(), (std::vector<std::string>{"tiny", "plan", "action", "reflect"}));
    {  // as vLLM lists a LoRA adapter: its directory as root, the base model as parent
      const json list = json::parse(httplib::Client("127.0.0.1", port_).Get("/v1/models")->body);
      EXPECT_EQ(list["data"][3]["root"], role_dir("qv-shared-a-r8", "reflect"));
      EXPECT_EQ(list["data"][3]["parent"], "tiny");
      EXPECT_EQ(list["data"][1]["root"], role_dir("qv-shared-a-r8", "plan"));  // served from the start
    }
    auto [s4, reflect_got] = greedy("reflect", turn);
    ASSERT_EQ(s4, 200) << reflect_got.dump();
    EXPECT_EQ(text(reflect_got), text(reflect_ref));
    EXPECT_EQ(reflect_got["lragent"]["choices"][0]["reused_tokens"], reflect_ref["lragent"]["choices"][0]["reused_tokens"]);
    EXPECT_EQ(reflect_got["lragent"]["choices"][0]["prefilled_tokens"],
              reflect_ref["lragent"]["choices"][0]["prefilled_tokens"]);
    EXPECT_EQ(reflect_got["lragent"]["choices"][0]["trajectory"], plan_got["lragent"]["choices"][0]["trajectory"])
        << "reflect goes on on the trajectory plan wrote";
    if (mode == ShareMode::kBaseLr)
      EXPECT_LT(reflect_got["lragent"]["choices"][0]["prefilled_tokens"].get<int>(), 8)
          << "reflect reads the shared cache: it computes the new text only";

    auto [again, again_body] = load("reflect", role_dir("qv-shared-a-r8", "reflect"));
    EXPECT_EQ(again, 400);
    EXPECT_NE(again_body.dump().find("already been loaded"), std::string::npos) << again_body.dump();

    auto [us, ubody] = unload("reflect");
    ASSERT_EQ(us, 200) << ubody.dump();
    EXPECT_EQ(ubody, "Success: LoRA adapter 'reflect' removed successfully.");
    EXPECT_EQ(models(), (std::vector<std::string>{"tiny", "plan", "action"}));
    EXPECT_EQ(greedy("reflect", turn).first, 404);
    EXPECT_EQ(unload("reflect").first, 404);
    EXPECT_EQ(server_->retired_adapters(), 0u);
    // action goes on on the same trajectory after reflect left it.
    auto [s5, action_got] = greedy("action", turn + text(reflect_got));
    ASSERT_EQ(s5, 200) << action_got.dump();
    EXPECT_EQ(action_got["lragent"]["choices"][0]["trajectory"], plan_got["lragent"]["choices"][0]["trajectory"]);

    ASSERT_EQ(load("reflect", role_dir("qv-shared-a-r8", "reflect")).first, 200);
    auto [s6, reflect_again] = greedy("reflect", turn);
    ASSERT_EQ(s6, 200);
    EXPECT_EQ(text(reflect_again), text(reflect_ref));
    stop();  // reg_ holds the reloaded reflect again, as at the start of the next mode
  }
}

// An adapter whose lora_A no served adapter shares cannot join their base-lr trajectories: it is
// served in a group of its own, and answers as generate does with it.
TEST_F(RuntimeLoraTest, AnAdapterOfAnotherAUnderBaseLrIsServedApart) {
  ServerOptions o;
  o.runtime_lora = true;
  start(ShareMode::kBaseLr, o);
  const std::string prompt = "The little dog ran to the park.";
  ASSERT_EQ(greedy("plan", prompt).first, 200);
  auto [ls, lbody] = load("indep", role_dir("qv-indep-a-r8", "action"));
  ASSERT_EQ(ls, 200) << lbody.dump();
  auto [s, got] = greedy("indep", prompt);
  ASSERT_EQ(s, 200) << got.dump();
  EXPECT_EQ(text(got), generate_text(prompt, "indep", 8));
  EXPECT_EQ(got["lragent"]["choices"][0]["reused_tokens"], 1) << "no trajectory of another A is read (only BOS)";
}

// vLLM's load_inplace: an adapter that cannot be read leaves the served one as it was; one that
// can replaces it, and requests for the name then answer with the new weights.
TEST_F(RuntimeLoraTest, LoadInplaceReplacesOnlyWhatItCanRead) {
  ServerOptions o;
  o.runtime_lora = true;
  start(ShareMode::kBaseLr, o);
  const std::string prompt = "Once upon a time";
  const std::string before = text(greedy("reflect", prompt).second);
  auto inplace = [&](const std::string& dir) {
    return post("/v1/load_lora_adapter", json{{"lora_name", "reflect"}, {"lora_path", dir}, {"load_inplace", true}});
  };
  EXPECT_EQ(inplace(testing::temp_dir("runtime_lora_inplace_empty")).first, 404);
  EXPECT_EQ(models(), (std::vector<std::string>{"tiny", "plan", "action", "reflect"}));
  EXPECT_EQ(text(greedy("reflect", prompt).second), before);
  auto [st, body] = inplace(role_dir("qv-shared-a-r8", "action"));
  ASSERT_EQ(st, 200) << body.dump();
  EXPECT_EQ(models(), (std::vector<std::string>{"tiny", "plan", "action", "reflect"}));
  // A new prompt (in base-lr a kept trajectory's shared entries come from whichever agent wrote them).
  const std::string fresh = "The little dog ran to the park.";
  EXPECT_EQ(text(greedy("reflect", fresh).second), generate_text(fresh, "reflect", 8));  // reg_'s new reflect
  EXPECT_EQ(generate_text(fresh, "reflect", 8), generate_text(fresh, "action", 8));     // the same files
}

// Unloaded while a request runs on it (from the request's first piece of text): the request
// finishes with the text it would have had, and the adapter's weights are kept until its
// trajectory is released, then freed (ASan checks nothing reads them after). The unload runs on
// the engine thread between passes, so on a loaded machine the request may end first: then it
// is loaded again and tried again (a few times, then skipped saying so).
TEST_F(RuntimeLoraTest, UnloadingAnAdapterARequestRunsOnLetsItFinish) {
  ServerOptions o;
  o.runtime_lora = true;
  start(ShareMode::kBaseLr, o);
  const std::string prompt = "Once upon a time";
  const int n = 450;  // the 512-token context, whatever EOS says
  CompletionRequest req = request({{"model", "reflect"}, {"prompt", prompt}, {"max_tokens", n}, {"temperature", 0},
                                   {"ignore_eos", true}});
  req.stream = true;
  // The tokens generate gives reflect for it (EOS ignored too).
  GenerateRequest g;
  g.prompt = *tok_->encode(prompt, true);
  g.max_tokens = n;
  g.adapter = reg_.find("reflect");
  Generator gen(*model_, EngineOptions{});
  auto ref = gen.run({g});
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  const std::vector<int32_t> want = (*ref)[0].output;
  bool while_running = false;
  for (int attempt = 0; attempt < 5 && !while_running; ++attempt) {
    if (attempt > 0) ASSERT_EQ(load("reflect", role_dir("qv-shared-a-r8", "reflect")).first, 200);
    bool unloaded = false;
    size_t retired_then = 0;
    std::string streamed;
    auto r = server_->complete(req, [&](const CompletionDelta& d) {
      if (!unloaded) {
        unloaded = true;
        Status st = server_->unload_adapter("reflect");
        EXPECT_TRUE(st.ok()) << st.error().message;
        retired_then = server_->retired_adapters();
      }
      streamed += d.text;
      return true;
    });
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_TRUE(unloaded);
    EXPECT_EQ((*r)[0].completion_tokens, n);
    EXPECT_EQ((*r)[0].token_ids, want) << "attempt " << attempt;
    EXPECT_EQ(streamed, (*r)[0].text);
    EXPECT_EQ(server_->retired_adapters(), 0u) << "freed once the request released its trajectory";
    EXPECT_EQ(greedy("reflect", prompt).first, 404);
    while_running = retired_then == 1;  // held by the running request's trajectory
  }
  EXPECT_EQ(greedy("plan", prompt).first, 200);
  if (!while_running) GTEST_SKIP() << "every request ended before its unload ran (a loaded machine)";
}

// Bad loads get their cause (and the server keeps serving): the routes off by default, a body
// that is not JSON or lacks a field, a directory with no adapter, a corrupt adapter_config.json,
// the base model's name, a rank over --max-lora-rank, unloading the base model or an unknown
// name; with --api-key, the key.
TEST_F(RuntimeLoraTest, BadLoadsAreRefusedWithTheirCause) {
  start(ShareMode::kBaseLr);
  auto expect = [&](int want, const std::pair<int, json>& got, const std::string& words) {
    EXPECT_EQ(got.first, want) << got.second.dump();
    EXPECT_NE(got.second.dump().find(words), std::string::npos) << got.second.dump();
  };
  expect(404, load("x", role_dir("qv-shared-a-r8", "plan")), "--enable-runtime-lora");
  stop();

  // Only the base model served at start (its adapters are of rank 8).
  for (const char* role : {"plan", "action", "reflect"}) ASSERT_NE(reg_.remove(role), nullptr);
  ServerOptions o;
  o.runtime_lora = true;
  o.max_lora_rank = 4;
  o.api_key = "sesame";
  start(ShareMode::kBaseLr, o);
  expect(401, load("x", role_dir("qkvo-shared-a-r4", "plan")), "API key");
  const httplib::Headers key = {{"Authorization", "Bearer sesame"}};
  auto post_key = [&](const char* route, const json& body) { return post(route, body.dump(), key); };
  expect(400, post("/v1/load_lora_adapter", "{not json", key), "not valid JSON");
  expect(400, post_key("/v1/load_lora_adapter", {{"lora_name", "x"}}), "'lora_path' is missing");
  expect(400, post_key("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", "/tmp"}, {"load_inplace", 1}}),
         "'load_inplace' must be true or false");
  expect(400, post_key("/v1/load_lora_adapter", {{"lora_path", "/tmp"}}), "'lora_name'");
  const std::string empty = testing::temp_dir("runtime_lora_empty");
  auto missing = post_key("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", empty}});
  EXPECT_TRUE(missing.first == 404 || missing.first == 400) << missing.second.dump();
  EXPECT_NE(missing.second.dump().find("adapter_config.json"), std::string::npos) << missing.second.dump();
  // A copy of a real adapter whose config is cut short.
  const std::string bad = testing::temp_dir("runtime_lora_bad");
  std::filesystem::copy(role_dir("qkvo-shared-a-r4", "plan"), bad, std::filesystem::copy_options::overwrite_existing);
  std::ofstream(bad + "/adapter_config.json") << "{\"r\": 4, \"lora_alpha\"";
  expect(400, post_key("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", bad}}), "adapter_config.json");
  expect(400, post_key("/v1/load_lora_adapter", {{"lora_name", "tiny"}, {"lora_path", role_dir("qkvo-shared-a-r4", "plan")}}),
         "base model");
  expect(400, post_key("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", role_dir("qv-shared-a-r8", "plan")}}),
         "--max-lora-rank 4");
  expect(400, post_key("/v1/unload_lora_adapter", {{"lora_name", "tiny"}}), "base model");
  expect(404, post_key("/v1/unload_lora_adapter", {{"lora_name", "nobody"}}), "cannot be found");
  // Still serving, and an adapter of rank 4 loads (in base-lr, into a group of its own: the base
  // model's has no low-rank cache).
  auto [ls, lbody] = post_key("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", role_dir("qkvo-shared-a-r4", "plan")}});
  ASSERT_EQ(ls, 200) << lbody.dump();
  auto [s, got] = post("/v1/completions", json{{"model", "x"}, {"prompt", "Once"}, {"max_tokens", 4}, {"temperature", 0}}.dump(), key);
  ASSERT_EQ(s, 200) << got.dump();
  EXPECT_EQ(text(got), generate_text("Once", "x", 4));
}

}  // namespace
}  // namespace lragent::server
