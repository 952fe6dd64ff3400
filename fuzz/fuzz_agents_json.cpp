// libFuzzer target: arbitrary bytes as the agent-side JSON inputs: a replay script
// (`lragent replay --script`), a trajectory bundle (`lragent bench trace`) and a HotpotQA
// questions file (`lragent run --questions`). Each parser must return an error naming its source
// (never crash or throw), and what it accepts must be usable as the commands use it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "agents/hotpotqa.h"
#include "agents/replay.h"
#include "agents/trace.h"

namespace {

void check_names_source(const lragent::Error& e, const std::string& source) {
  if (e.message.find(source) == std::string::npos) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  auto script = lragent::parse_replay_script(text, "<fuzz script>");
  if (!script.ok()) {
    check_names_source(script.error(), "<fuzz script>");
  } else {
    // What replay relies on: every generate / force step names its agent; generate counts are
    // not negative; forced and appended ids are not negative.
    using Kind = lragent::ReplayStep::Kind;
    for (const lragent::ReplayStep& st : *script) {
      if ((st.kind == Kind::kGenerate || st.kind == Kind::kForce) && st.agent.empty()) __builtin_trap();
      if (st.kind == Kind::kGenerate && st.generate < 0) __builtin_trap();
      for (int32_t id : st.tokens)
        if (id < 0) __builtin_trap();
    }
  }

  auto bundle = lragent::parse_trajectory_bundle(text, "<fuzz bundle>");
  if (!bundle.ok()) {
    check_names_source(bundle.error(), "<fuzz bundle>");
  } else {
    // bench trace's use: at its smallest length and one longer, an accepted trajectory makes a
    // trace of exactly that length, or (no retrieval observation to scale) a kInvalidArgument
    // error naming it; never an internal error.
    for (const lragent::SourceTrajectory& t : bundle->trajectories) {
      const int64_t lo = lragent::trace_min_tokens(t);
      for (const int64_t target : {lo, lo + 97}) {
        auto trace = lragent::make_trace(t, target, 512);
        if (trace.ok() ? trace->final_tokens() != target : trace.error().code != lragent::ErrorCode::kInvalidArgument)
          __builtin_trap();
      }
    }
  }

  auto questions = lragent::parse_hotpot_questions(text, "<fuzz questions>");
  if (!questions.ok()) {
    check_names_source(questions.error(), "<fuzz questions>");
  } else if (questions->empty()) {
    __builtin_trap();  // "holds no questions" is an error, never an empty success
  }
  return 0;
}
