// `lragent serve --speculative-config` (SessionPoolOptions::replay.speculative): greedy completions
// give the Generator's text (one pass a token) streamed or not, concurrent ones too; a choice that
// checked drafts says so in its `lragent` field, and /metrics counts the drafts as vLLM's
// spec_decode counters do; seeded sampled requests speculate too and give the text they give
// without drafts.
#include <future>

#include "server/server_fixture.h"

namespace lragent::server {
namespace {

// A labelled counter's value in a /metrics text, e.g. name{model_name="plan"} (-1: absent).
double labelled(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
}

class SpeculativeServerTest : public ServerTest {
 protected:
  void start_speculating(ShareMode mode) {
    ServerOptions o;
    o.pool.replay.speculative.num_tokens = 4;
    o.pool.replay.speculative.lookup_min = 1;
    o.pool.replay.speculative.lookup_max = 3;
    start(mode, o);
  }
};

const char* const kPrompts[] = {
    "Once upon a time, there was a little girl named Lily. Lily had a red ball. Lily",
    "Tom had a big dog. The big dog liked to run. One day, Tom and the big dog",
    "The cat sat on the mat. The cat was happy. The cat",
};

TEST_F(SpeculativeServerTest, GreedyTextIsThatOfOnePassAToken) {
  for (ShareMode mode : {ShareMode::kBaseLr, ShareMode::kNone}) {
    SCOPED_TRACE(share_mode_name(mode));
    start_speculating(mode);
    int64_t accepted = 0;
    for (size_t i = 0; i < std::size(kPrompts); ++i) {
      const std::string model = std::vector<std::string>{"tiny", "plan", "action"}[i];
      const std::string want = generate_text(kPrompts[i], model == "tiny" ? "" : model, 40);
      auto [status, j] = complete({{"model", model}, {"prompt", kPrompts[i]}, {"max_tokens", 40}, {"temperature", 0}});
      ASSERT_EQ(status, 200) << j.dump();
      EXPECT_EQ(j["choices"][0]["text"], want) << model;
      const json& c = j["lragent"]["choices"][0];
      if (c.contains("speculative")) {
        const json& sp = c["speculative"];
        EXPECT_GT(sp["draft_passes"].get<int64_t>(), 0);
        EXPECT_LE(sp["accepted_tokens"].get<int64_t>(), sp["draft_tokens"].get<int64_t>());
        accepted += sp["accepted_tokens"].get<int64_t>();
      }
      // Streamed: the same text, several tokens a pass arriving as pieces.
      httplib::Client cl("127.0.0.1", port_);
      auto r = cl.Post("/v1/completions",
                       json{{"model", model}, {"prompt", kPrompts[i]}, {"max_tokens", 40}, {"temperature", 0},
                            {"stream", true}}
                           .dump(),
                       "application/json");
      ASSERT_TRUE(r && r->status == 200);
      EXPECT_EQ(parse_sse(r->body).text[0], want) << model;
    }
    EXPECT_GT(accepted, 0);  // drafts were kept, so the comparison covers them
    auto m = httplib::Client("127.0.0.1", port_).Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_GT(labelled(m->body, "lragent:spec_decode_num_accepted_tokens_total{model_name=\"plan\"}"), 0) << m->body;
    EXPECT_GE(labelled(m->body, "lragent:spec_decode_num_draft_tokens_total{model_name=\"plan\"}"),
              labelled(m->body, "lragent:spec_decode_num_accepted_tokens_total{model_name=\"plan\"}"));
    stop();
  }
}

// The suffix method: the server keeps one corpus of finished outputs for all trajectories, so a
// request whose answer another request already wrote drafts most of it from there.
TEST_F(SpeculativeServerTest, TheSuffixMethodDraftsFromEarlierAnswers) {
  ServerOptions o;
  o.pool.replay.speculative.method = SpeculativeMethod::kSuffix;
  o.pool.replay.speculative.num_tokens = 8;
  start(ShareMode::kBaseLr, o);
  const std::string want = generate_text(kPrompts[1], "action", 40);
  std::vector<int64_t> accepted;
  for (const char* prompt : {kPrompts[1], kPrompts[1]}) {
    auto [status, j] = complete({{"model", "action"}, {"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}});
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], want);
    const json& c = j["lragent"]["choices"][0];
    accepted.push_back(c.contains("speculative") ? c["speculative"]["accepted_tokens"].get<int64_t>() : 0);
  }
  EXPECT_GT(accepted[1], accepted[0]);
  EXPECT_GE(accepted[1], 20) << "the second answer is mostly drafted from the first";
  stop();
}

TEST_F(SpeculativeServerTest, ConcurrentAndSeededSampledRequestsGiveTheirTextWithoutDrafts) {
  start_speculating(ShareMode::kBaseLr);
  std::vector<std::string> want;
  for (size_t i = 0; i < std::size(kPrompts); ++i) want.push_back(generate_text(kPrompts[i], "reflect", 32));
  std::vector<std::future<std::pair<int, json>>> answers;
  for (size_t i = 0; i < std::size(kPrompts); ++i)
    answers.push_back(std::async(std::launch::async, [this, i] {
      return complete({{"model", "reflect"}, {"prompt", kPrompts[i]}, {"max_tokens", 32}, {"temperature", 0}});
    }));
  // A seeded sampled request beside them: it checks drafts too, each kept exactly when the draw
  // one pass a token makes picks it, so its answer is the one given without speculation.
  // (Its own prompt: base-lr's cache of a prompt the others read would be whichever agent's computed it.)
  const json sampled = {{"model", "plan"},
                        {"prompt", "Lily and Ben went to the park. Lily and Ben played with a ball. Lily and Ben"},
                        {"max_tokens", 40},
                        {"temperature", 0.3},
                        {"seed", 5}};
  auto [s1, a1] = complete(sampled);
  ASSERT_EQ(s1, 200) << a1.dump();
  ASSERT_TRUE(a1["lragent"]["choices"][0].contains("speculative")) << a1.dump();
  EXPECT_GT(a1["lragent"]["choices"][0]["speculative"]["accepted_tokens"].get<int64_t>(), 0) << a1.dump();
  for (size_t i = 0; i < answers.size(); ++i) {
    auto [status, j] = answers[i].get();
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_EQ(j["choices"][0]["text"], want[i]) << i;
  }
  stop();
  start(ShareMode::kBaseLr);
  auto [s2, a2] = complete(sampled);
  ASSERT_EQ(s2, 200) << a2.dump();
  EXPECT_EQ(a2["choices"][0]["text"], a1["choices"][0]["text"]);
  stop();
}

}  // namespace
}  // namespace lragent::server
