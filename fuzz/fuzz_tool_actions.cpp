// libFuzzer target: arbitrary bytes as a ReAct agent's output, the untrusted text `lragent run`
// hands its tools (agents/tools.h): each line through parse_action, ToolEnv::act and
// ToolEnv::reflect over a two-paragraph HotpotQA question. Every line must give an outcome,
// never a crash or throw, and the outcomes must hold what the workflow relies on: an observation
// of one line, a valid step names a known tool (an invalid one none), a finished episode has an
// answer, and a verdict is right, wrong or none.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "agents/hotpotqa.h"
#include "agents/tools.h"

namespace {

lragent::HotpotQuestion question() {
  lragent::HotpotQuestion q;
  q.id = "fuzz";
  q.question = "Which magazine was started first, Arthur's Magazine or First for Women?";
  q.answer = "Arthur's Magazine";
  q.context = {{"Arthur's Magazine",
                {"Arthur's Magazine (1844-1846) was an American literary periodical published in Philadelphia.",
                 "It was edited by T.S. Arthur."}},
               {"First for Women",
                {"First for Women is a woman's magazine published by Bauer Media Group in the USA.",
                 "The magazine was started in 1989."}}};
  return q;
}

void check_step(const lragent::ToolEnv& env, const lragent::ToolStep& st) {
  if (st.observation.find('\n') != std::string::npos) __builtin_trap();
  if (st.valid) {
    bool known = false;
    for (const auto& t : env.tools()) known = known || t->name() == st.tool;
    if (!known) __builtin_trap();
  } else if (!st.tool.empty()) {
    __builtin_trap();  // an invalid action names no tool
  }
  if (env.finished() && env.answer().empty()) __builtin_trap();
  if (!env.verdict().empty() && env.verdict() != "right" && env.verdict() != "wrong") __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  lragent::ToolEnv env(question());
  for (size_t at = 0; at <= text.size();) {
    const size_t nl = text.find('\n', at);
    const std::string_view line = text.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at);
    const lragent::ParsedAction pa = lragent::parse_action(line);
    if (pa.ok && (pa.tool.empty() || pa.tool.find('\n') != std::string::npos || pa.arg.find('\n') != std::string::npos))
      __builtin_trap();
    check_step(env, env.act(line));
    check_step(env, env.reflect(line));
    (void)env.answer_correct();
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  return 0;
}
