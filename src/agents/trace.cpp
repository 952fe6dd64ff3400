#include "agents/trace.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/text_file.h"

namespace lragent {

Result<TrajectoryBundle> parse_trajectory_bundle(const std::string& json_text, const std::string& source) {
  LRA_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json(json_text, source));
  if (!j.is_object() || !j.contains("trajectories") || !j["trajectories"].is_array())
    return make_error(ErrorCode::kCorrupt, "{}: expected an object with a \"trajectories\" array (made by scripts/make_traces.py)",
                      source);
  TrajectoryBundle b;
  if (j.contains("source") && j["source"].is_string()) b.source = j["source"].get<std::string>();
  size_t ti = 0;
  for (const auto& t : j["trajectories"]) {
    auto str = [&](const nlohmann::json& o, const char* key, std::string& out, const std::string& where) -> Status {
      if (!o.is_object() || !o.contains(key) || !o[key].is_string())
        return make_error(ErrorCode::kCorrupt, "{}: {}: \"{}\" must be a string", source, where, key);
      out = o[key].get<std::string>();
      return Status::Ok();
    };
    const std::string where = fmt::format("trajectory {}", ti);
    SourceTrajectory st;
    LRA_RETURN_IF_ERROR(str(t, "id", st.id, where));
    LRA_RETURN_IF_ERROR(str(t, "question", st.question, where));
    LRA_RETURN_IF_ERROR(str(t, "system_prompt", st.system_prompt, where));
    if (t.contains("answer") && t["answer"].is_string()) st.answer = t["answer"].get<std::string>();
    if (!t.contains("rounds") || !t["rounds"].is_array() || t["rounds"].empty())
      return make_error(ErrorCode::kCorrupt, "{}: {}: \"rounds\" must be a non-empty array", source, where);
    size_t ri = 0;
    for (const auto& r : t["rounds"]) {
      const std::string rw = fmt::format("{} round {}", where, ri + 1);
      TraceRound tr;
      LRA_RETURN_IF_ERROR(str(r, "agent", tr.agent, rw));
      LRA_RETURN_IF_ERROR(str(r, "thought", tr.thought, rw));
      LRA_RETURN_IF_ERROR(str(r, "action", tr.action, rw));
      LRA_RETURN_IF_ERROR(str(r, "observation", tr.observation, rw));
      if (tr.agent != "plan" && tr.agent != "reflect")
        return make_error(ErrorCode::kCorrupt, "{}: {}: \"agent\" is '{}'; expected plan or reflect", source, rw, tr.agent);
      if (!r.contains("retrieval") || !r["retrieval"].is_boolean())
        return make_error(ErrorCode::kCorrupt, "{}: {}: \"retrieval\" must be true or false", source, rw);
      tr.retrieval = r["retrieval"].get<bool>();
      st.rounds.push_back(std::move(tr));
      ++ri;
    }
    b.trajectories.push_back(std::move(st));
    ++ti;
  }
  if (b.trajectories.empty()) return make_error(ErrorCode::kCorrupt, "{}: \"trajectories\" is empty", source);
  return b;
}

Result<TrajectoryBundle> load_trajectory_bundle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(ErrorCode::kNotFound, "{}: cannot open the trajectory file (make it with scripts/make_traces.py)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_trajectory_bundle(ss.str(), path);
}

std::vector<int32_t> pseudo_tokenize(std::string_view text, int vocab_size) {
  assert(vocab_size > 3 && "pseudo_tokenize needs ids above the 3 reserved ones");
  std::vector<int32_t> ids;  // [ceil(bytes / 4)]
  ids.reserve(text.size() / 4 + 1);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
    for (size_t j = i; j < std::min(text.size(), i + 4); ++j) {
      h ^= static_cast<unsigned char>(text[j]);
      h *= 0x100000001b3ull;
    }
    ids.push_back(static_cast<int32_t>(3 + h % static_cast<uint64_t>(vocab_size - 3)));
  }
  return ids;
}

int64_t Trace::final_tokens() const {
  int64_t n = 1;
  for (const TraceStep& s : steps) n += s.kind == TraceStep::Kind::kAppend ? static_cast<int64_t>(s.tokens.size()) : s.generate;
  return n;
}

int Trace::agent_calls() const {
  return static_cast<int>(std::count_if(steps.begin(), steps.end(), [](const TraceStep& s) { return s.kind == TraceStep::Kind::kCall; }));
}

int64_t Trace::generated_tokens() const {
  int64_t n = 0;
  for (const TraceStep& s : steps) n += s.kind == TraceStep::Kind::kCall ? s.generate : 0;
  return n;
}

std::vector<ReplayStep> Trace::replay_steps() const {
  std::vector<ReplayStep> out;
  for (const TraceStep& s : steps) {
    ReplayStep r;
    if (s.kind == TraceStep::Kind::kAppend) {
      r.kind = ReplayStep::Kind::kAppendTokens;
      r.tokens = s.tokens;
    } else {
      r.kind = ReplayStep::Kind::kGenerate;
      r.agent = s.agent;
      r.generate = s.generate;
    }
    out.push_back(std::move(r));
  }
  return out;
}

nlohmann::json Trace::to_json() const {
  nlohmann::json steps_j = nlohmann::json::array();
  for (const TraceStep& s : steps) {
    if (s.kind == TraceStep::Kind::kAppend)
      steps_j.push_back({{"append_tokens", s.tokens}, {"label", s.label}, {"round", s.round}});
    else
      steps_j.push_back({{"agent", s.agent}, {"generate", s.generate}, {"label", s.label}, {"round", s.round}});
  }
  return {{"source", source_id},
          {"target_tokens", target_tokens},
          {"final_tokens", final_tokens()},
          {"agent_calls", agent_calls()},
          {"generated_tokens", generated_tokens()},
          {"system_tokens", system_tokens},
          {"system_tokens_full", system_tokens_full},
          {"observation_tokens", observation_tokens},
          {"steps", std::move(steps_j)}};
}

namespace {

// The trace with the system prompt and retrieval contents still to be sized.
struct Skeleton {
  std::vector<TraceStep> steps;
  size_t system_step = 0;
  std::vector<size_t> retrieval_steps;              // steps whose middle is a retrieval content
  std::vector<std::vector<int32_t>> retrieval_real;  // [n_retrieval][real tokens]
  std::vector<int32_t> system_real;
  int64_t fixed = 1;  // BOS + every token but the system prompt and retrieval contents
  std::vector<int32_t> newline;
};

Skeleton skeleton_of(const SourceTrajectory& t, int vocab) {
  Skeleton sk;
  sk.newline = pseudo_tokenize("\n", vocab);
  auto append = [&](std::string label, int round, std::vector<int32_t> tokens) {
    TraceStep s;
    s.label = std::move(label);
    s.round = round;
    s.tokens = std::move(tokens);
    sk.fixed += static_cast<int64_t>(s.tokens.size());
    sk.steps.push_back(std::move(s));
  };
  auto call = [&](std::string agent, std::string label, int round, const std::string& real_text) {
    TraceStep s;
    s.kind = TraceStep::Kind::kCall;
    s.agent = std::move(agent);
    s.label = std::move(label);
    s.round = round;
    s.generate = static_cast<int>(std::max<int64_t>(1, pseudo_token_count(real_text)));
    sk.fixed += s.generate;
    sk.steps.push_back(std::move(s));
  };
  sk.system_real = pseudo_tokenize(t.system_prompt, vocab);
  sk.system_step = sk.steps.size();
  append("system", 0, {});
  append("question", 0, pseudo_tokenize("Question: " + t.question + "\n", vocab));
  for (size_t i = 0; i < t.rounds.size(); ++i) {
    const TraceRound& r = t.rounds[i];
    const int k = static_cast<int>(i + 1);
    append("prefix", k, pseudo_tokenize(fmt::format("Thought {}:", k), vocab));
    if (r.agent == "reflect") {
      call("reflect", "reflect", k, fmt::format(" {}\nAction {}: {}\n", r.thought, k, r.action));
    } else {
      call("plan", "thought", k, " " + r.thought + "\n");
      append("prefix", k, pseudo_tokenize(fmt::format("Action {}:", k), vocab));
      call("action", "action", k, " " + r.action + "\n");
    }
    if (r.observation.empty()) continue;
    std::vector<int32_t> obs = pseudo_tokenize(fmt::format("Observation {}: ", k), vocab);
    if (r.retrieval) {
      // The content is inserted by make_trace; only the prefix and newline are fixed.
      obs.insert(obs.end(), sk.newline.begin(), sk.newline.end());
      sk.retrieval_steps.push_back(sk.steps.size());
      sk.retrieval_real.push_back(pseudo_tokenize(r.observation, vocab));
    } else {
      const auto content = pseudo_tokenize(r.observation, vocab);
      obs.insert(obs.end(), content.begin(), content.end());
      obs.insert(obs.end(), sk.newline.begin(), sk.newline.end());
    }
    append("observation", k, std::move(obs));
  }
  return sk;
}

// Splits `total` into parts proportional to `weights`, each at least 1 (total >= weights.size()):
// floors, then the leftover one by one to the largest remainders (earlier index on ties).
std::vector<int64_t> apportion(int64_t total, const std::vector<int64_t>& weights) {
  const int64_t n = static_cast<int64_t>(weights.size());
  const int64_t w_sum = std::max<int64_t>(1, std::accumulate(weights.begin(), weights.end(), int64_t{0}));
  const int64_t extra = total - n;
  std::vector<int64_t> parts(weights.size()), rem(weights.size());
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    // extra * w fits in int64 for any trace below 2^40 tokens with observations below 2^20 tokens.
    const int64_t q = extra * weights[i];
    parts[i] = 1 + q / w_sum;
    rem[i] = q % w_sum;
    given += parts[i];
  }
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rem[a] > rem[b]; });
  for (size_t i = 0; given < total; ++i, ++given) ++parts[order[i % order.size()]];
  return parts;
}

// The first n tokens of `real`, repeated from its start as often as needed.
std::vector<int32_t> resized(const std::vector<int32_t>& real, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n));  // [n]
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = real[static_cast<size_t>(i) % real.size()];
  return out;
}

}  // namespace

int64_t trace_min_tokens(const SourceTrajectory& t) {
  const Skeleton sk = skeleton_of(t, 1 << 16);  // token counts do not depend on the vocabulary
  return sk.fixed + static_cast<int64_t>(sk.retrieval_steps.size());
}

Result<Trace> make_trace(const SourceTrajectory& t, int64_t target, int vocab_size) {
  if (vocab_size <= 3) return make_error(ErrorCode::kInvalidArgument, "trace: vocabulary of {} ids is too small", vocab_size);
  Skeleton sk = skeleton_of(t, vocab_size);
  const int64_t n_r = static_cast<int64_t>(sk.retrieval_steps.size());
  if (n_r == 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "trajectory '{}' has no retrieval observation (BingSearch / Retrieve / Lookup result) to scale", t.id);
  const int64_t min_tokens = sk.fixed + n_r;
  if (target < min_tokens)
    return make_error(ErrorCode::kInvalidArgument,
                      "trace length {} is too short for trajectory '{}': its fixed part (question, step prefixes, "
                      "generated spans, one token per retrieval observation) takes {} tokens; use at least {}",
                      target, t.id, min_tokens, min_tokens);
  const int64_t s_full = static_cast<int64_t>(sk.system_real.size());
  std::vector<int64_t> weights;
  for (const auto& r : sk.retrieval_real) weights.push_back(static_cast<int64_t>(r.size()));
  const int64_t o_real = std::accumulate(weights.begin(), weights.end(), int64_t{0});
  const int64_t avail = target - sk.fixed;  // system prompt + retrieval contents
  int64_t s_keep = s_full;
  if (avail - s_full < n_r) {
    // Short target: the prompt and the contents shrink together, in their real proportion.
    s_keep = std::min(avail * s_full / std::max<int64_t>(1, s_full + o_real), avail - n_r);
  }
  const std::vector<int64_t> parts = apportion(avail - s_keep, weights);

  Trace tr;
  tr.source_id = t.id;
  tr.target_tokens = target;
  tr.system_tokens = s_keep;
  tr.system_tokens_full = s_full;
  tr.observation_tokens = avail - s_keep;
  sk.steps[sk.system_step].tokens.assign(sk.system_real.begin(), sk.system_real.begin() + s_keep);
  for (size_t i = 0; i < sk.retrieval_steps.size(); ++i) {
    auto& toks = sk.steps[sk.retrieval_steps[i]].tokens;  // prefix + newline so far
    const auto content = resized(sk.retrieval_real[i], parts[i]);
    toks.insert(toks.end() - static_cast<std::ptrdiff_t>(sk.newline.size()), content.begin(), content.end());
  }
  if (s_keep == 0) sk.steps.erase(sk.steps.begin() + static_cast<std::ptrdiff_t>(sk.system_step));
  tr.steps = std::move(sk.steps);
  if (tr.final_tokens() != target)
    return make_error(ErrorCode::kInternal, "trace of '{}': built {} tokens for a target of {}", t.id, tr.final_tokens(), target);
  return tr;
}

}  // namespace lragent
