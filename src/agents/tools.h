// The ReAct tool environment, offline: the tools the LRAgent poster's action agent calls
// (BingSearch, Retrieve, Lookup, Finish, Reflect) answered from one HotpotQA question's own
// context paragraphs instead of the web and Wikipedia.
//
//   BingSearch[query]   the paragraph sharing most words with the query: "Title: first sentences"
//   Retrieve[entity]    the paragraph whose title matches (case-insensitive, or fuzzily); else
//                       "Could not find [entity]. Similar: ['T1', 'T2', ...]"
//   Lookup[keyword]     "(Result i / n) sentence": the next sentence holding the keyword in the
//                       passage last found by BingSearch or Retrieve (a cursor per keyword)
//   Finish[answer]      records the answer; "Please reflect your answer."
//   Reflect[right/wrong] only right after Finish: right accepts the answer, wrong hands the
//                       episode back to the plan agent
// Agents write nonsense at times, so nothing here fails: a malformed or unknown action becomes
// an "Invalid action: ..." observation.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agents/hotpotqa.h"
#include "core/result.h"

namespace lragent {

class Tool {
 public:
  virtual ~Tool() = default;
  virtual std::string name() const = 0;         // as written in actions, e.g. "BingSearch"
  virtual std::string description() const = 0;  // one line, e.g. "BingSearch[query]: ..."
  // The observation for `arg`. An Error means the call itself was malformed (empty argument,
  // Reflect out of turn); the environment reports it as an invalid action.
  virtual Result<std::string> call(const std::string& arg) = 0;
};

// "Action 3: Retrieve[Milhouse]" -> {"Retrieve", "Milhouse"}. Tolerant: only the first line
// counts, any text before the tool name is ignored, spaces may precede '[', and a missing ']'
// (a generation cut short) takes the rest of the line. ok is false when no "Name[" is present.
struct ParsedAction {
  std::string tool;  // as written
  std::string arg;   // trimmed, surrounding quotes removed
  bool ok = false;
};
ParsedAction parse_action(std::string_view line);

// One action's outcome.
struct ToolStep {
  std::string tool;  // the tool's canonical name; empty when the action was invalid
  std::string arg;
  std::string observation;  // one line
  bool valid = false;
};

struct ToolEnvOptions {
  int search_sentences = 2;  // sentences BingSearch returns from the best paragraph
  int max_similar = 5;       // titles a failed Retrieve suggests
};

class ToolEnv {
 public:
  explicit ToolEnv(HotpotQuestion question, ToolEnvOptions opts = {});
  ~ToolEnv();
  ToolEnv(const ToolEnv&) = delete;
  ToolEnv& operator=(const ToolEnv&) = delete;

  // Parses and runs one action line.
  ToolStep act(std::string_view line);
  // Runs the Reflect[...] found anywhere in a reflect agent's line ("seems right, so Reflect[right]");
  // without one the step is invalid and nothing changes.
  ToolStep reflect(std::string_view line);

  const HotpotQuestion& question() const;
  const std::vector<std::unique_ptr<Tool>>& tools() const { return tools_; }
  bool finished() const;               // Finish was called and Reflect has not rejected it
  const std::string& answer() const;   // the last Finish argument
  const std::string& verdict() const;  // the last Reflect argument: "right", "wrong" or ""
  // The answer matches the question's gold answer (HotpotQA exact match); false when unknown.
  bool answer_correct() const;

  struct State;  // what the tools share: the paragraphs, the last passage, the episode

 private:
  std::unique_ptr<State> st_;
  std::vector<std::unique_ptr<Tool>> tools_;  // BingSearch, Retrieve, Lookup, Finish, Reflect
};

}  // namespace lragent
