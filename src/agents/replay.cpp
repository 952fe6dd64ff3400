#include "agents/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "agents/agent_turn.h"
#include "core/text_file.h"
#include "engine/sampler.h"

namespace lragent {

Result<std::vector<ReplayStep>> parse_replay_script(const std::string& json_text, const std::string& source) {
  LRA_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json(json_text, source));
  if (!j.is_object() || !j.contains("steps") || !j["steps"].is_array())
    return make_error(ErrorCode::kCorrupt, "{}: expected an object with a \"steps\" array", source);
  std::vector<ReplayStep> steps;
  size_t i = 0;
  auto ids_of = [&](const nlohmann::json& v, const char* key) -> Result<std::vector<int32_t>> {
    if (!v.is_array()) return make_error(ErrorCode::kCorrupt, "{}: step {}: \"{}\" must be an array of token ids", source, i, key);
    std::vector<int32_t> ids;
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        return make_error(ErrorCode::kCorrupt, "{}: step {}: \"{}\" holds a value that is not a token id", source, i, key);
      ids.push_back(x.get<int32_t>());
    }
    return ids;
  };
  for (const auto& s : j["steps"]) {
    ReplayStep st;
    if (!s.is_object()) return make_error(ErrorCode::kCorrupt, "{}: step {} is not an object", source, i);
    // One action per step, and no key that would be ignored: a typo or a second action must not
    // be dropped silently. "label", "round" (written by `bench trace --dump-traces`) and
    // "comment" are annotations any step may carry.
    const char* action = s.contains("append")          ? "append"
                         : s.contains("append_tokens") ? "append_tokens"
                         : s.contains("agent")         ? "agent"
                                                       : nullptr;
    if (action == nullptr)
      return make_error(ErrorCode::kCorrupt, "{}: step {}: expected one of \"append\", \"append_tokens\" or \"agent\"",
                        source, i);
    const bool generates = s.contains("generate");
    for (const auto& [key, value] : s.items()) {
      const bool annotation = key == "label" || key == "round" || key == "comment";
      const bool allowed = annotation || key == action || (std::string_view(action) == "agent" &&
                                             (key == "generate" || key == "force_tokens" || (key == "stop" && generates)));
      if (!allowed)
        return make_error(ErrorCode::kCorrupt,
                          "{}: step {}: \"{}\" does not belong in an \"{}\" step (a step is {{\"append\": TEXT}}, "
                          "{{\"append_tokens\": [IDS]}}, {{\"agent\": NAME, \"generate\": N, \"stop\": [...]}} or "
                          "{{\"agent\": NAME, \"force_tokens\": [IDS]}})",
                          source, i, key, action);
    }
    if (s.contains("append")) {
      if (!s["append"].is_string()) return make_error(ErrorCode::kCorrupt, "{}: step {}: \"append\" must be a string", source, i);
      st.kind = ReplayStep::Kind::kAppendText;
      st.text = s["append"].get<std::string>();
    } else if (s.contains("append_tokens")) {
      st.kind = ReplayStep::Kind::kAppendTokens;
      LRA_ASSIGN_OR_RETURN(st.tokens, ids_of(s["append_tokens"], "append_tokens"));
    } else {
      if (!s["agent"].is_string() || s["agent"].get<std::string>().empty())
        return make_error(ErrorCode::kCorrupt, "{}: step {}: \"agent\" must be a non-empty string (an agent's name)",
                          source, i);
      st.agent = s["agent"].get<std::string>();
      if (generates == s.contains("force_tokens"))
        return make_error(ErrorCode::kCorrupt, "{}: step {}: an agent step needs \"generate\" or \"force_tokens\", not {}",
                          source, i, generates ? "both" : "neither");
      if (s.contains("force_tokens")) {
        st.kind = ReplayStep::Kind::kForce;
        LRA_ASSIGN_OR_RETURN(st.tokens, ids_of(s["force_tokens"], "force_tokens"));
      } else {
        st.kind = ReplayStep::Kind::kGenerate;
        if (!s["generate"].is_number_integer() || s["generate"].get<int64_t>() < 0 || s["generate"].get<int64_t>() > 1 << 20)
          return make_error(ErrorCode::kCorrupt, "{}: step {}: \"generate\" must be a non-negative integer", source, i);
        st.generate = s["generate"].get<int>();
        if (s.contains("stop")) {
          if (!s["stop"].is_array()) return make_error(ErrorCode::kCorrupt, "{}: step {}: \"stop\" must be an array of strings", source, i);
          for (const auto& x : s["stop"]) {
            if (!x.is_string() || x.get<std::string>().empty())
              return make_error(ErrorCode::kCorrupt, "{}: step {}: \"stop\" must hold non-empty strings", source, i);
            st.stop.push_back(x.get<std::string>());
          }
        }
      }
    }
    steps.push_back(std::move(st));
    ++i;
  }
  return steps;
}

Result<std::unique_ptr<AgentSession>> AgentSession::create(LlamaModel& model, const Tokenizer* tok,
                                                           std::vector<std::string> names,
                                                           std::vector<const LoraAdapter*> adapters,
                                                           const ReplayOptions& opts) {
  std::unique_ptr<AgentSession> s(new AgentSession(model));
  s->tok_ = tok;
  s->names_ = std::move(names);
  s->adapters_ = adapters;
  s->keep_logits_ = opts.keep_logits;
  s->lookahead_ = opts.decode_lookahead;
  s->spec_ = opts.speculative;
  if (s->spec_.on() && s->spec_.method == SpeculativeMethod::kSuffix && !s->spec_.corpus) {
    s->corpus_ = std::make_unique<SuffixCorpus>(s->spec_.max_cached_requests);  // its own steps' outputs
    s->spec_.corpus = s->corpus_.get();
  }
  SharingOptions so = opts.sharing;
  if (model.config().max_position_embeddings > 0)
    so.max_tokens = std::min<int64_t>(so.max_tokens, model.config().max_position_embeddings);
  if (!so.backend) so.backend = pool_backend(model.backend());
  LRA_ASSIGN_OR_RETURN(s->kv_, TrajectoryKv::create(model.config(), std::move(adapters), so));
  s->computed_.assign(s->names_.size(), 0);
  s->partial_.assign(s->names_.size(), 0);
  const int bos = model.config().bos_token_id >= 0 ? model.config().bos_token_id : (tok ? tok->bos_id() : -1);
  if (bos >= 0) s->traj_.push_back(bos);
  return s;
}

Result<std::vector<int32_t>> AgentSession::encode(const std::string& text) const {
  if (!tok_) return make_error(ErrorCode::kNotFound, "the model has no tokenizer: use \"append_tokens\" instead of \"append\"");
  return tok_->encode(text, /*add_special_tokens=*/false);
}

SeqInput AgentSession::agent_input(int a, const std::vector<int32_t>& toks, int64_t begin, KvBinding* kv) const {
  SeqInput in;
  in.tokens = toks.data();
  in.n_tokens = static_cast<int>(toks.size());
  in.start_pos = begin;
  in.kv = kv;
  set_agent(in, a);
  return in;
}

void AgentSession::set_agent(SeqInput& in, int a) const {
  const LoraAdapter* adapter = adapters_[static_cast<size_t>(a)];
  if (kv_->mode() == ShareMode::kIcarus) {  // the base model writes the entries; the adapter decodes
    in.adapter = nullptr;
    in.decoder = adapter;
  } else {
    in.adapter = adapter;
    in.decoder = nullptr;
  }
}

Status AgentSession::catch_up_partial(int a, int64_t& begin) {
  const int layers = kv_->catchup_layers();
  if (layers >= model_.config().num_layers || traj_.empty()) return Status::Ok();
  const int64_t split = std::min<int64_t>(kv_->shared_tokens(), static_cast<int64_t>(traj_.size()) - 1);
  if (begin >= split) return Status::Ok();
  auto binding = kv_->bind(a);
  std::vector<int32_t> toks(traj_.begin() + begin, traj_.begin() + split);  // [split - begin]
  SeqInput in = agent_input(a, toks, begin, binding.get());
  LRA_RETURN_IF_ERROR(model_.forward_kv({in}, layers));
  kv_->advance(a, split);
  partial_[static_cast<size_t>(a)] += split - begin;
  begin = split;
  return Status::Ok();
}

bool AgentSession::stops(const std::vector<std::string>& stop, const std::vector<int32_t>& output) const {
  if (stop.empty() || !tok_) return false;
  const std::string text = tok_->decode(output);
  return std::any_of(stop.begin(), stop.end(), [&](const std::string& s) { return text.find(s) != std::string::npos; });
}

bool AgentSession::ends(const std::vector<std::string>& stop, const AgentDecode& dec, StepResult& r) const {
  const int32_t last = r.output_tokens.back();
  if (std::find(dec.stop_ids.begin(), dec.stop_ids.end(), last) != dec.stop_ids.end() ||
      stops(stop, r.output_tokens)) {
    r.finish_reason = "stop";
    return true;
  }
  const StepLogprobs* lp = r.logprobs.size() == r.output_tokens.size() ? &r.logprobs.back() : nullptr;
  if (dec.on_token && !dec.on_token(last, lp)) {
    r.finish_reason = "abort";
    return true;
  }
  return false;
}

int AgentSession::agent_index(const std::string& name) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  return it == names_.end() ? -1 : static_cast<int>(it - names_.begin());
}

Status AgentSession::start_from(const AgentSession& src, int64_t tokens, bool keep_counts) {
  // from[a]: src's agent of a's name and adapter (a name loaded again is another adapter).
  std::vector<int> from(names_.size(), -1);
  for (size_t a = 0; a < names_.size(); ++a) {
    const int j = src.agent_index(names_[a]);
    if (j >= 0 && src.adapters_[static_cast<size_t>(j)] == adapters_[a]) from[a] = j;
  }
  tokens = std::clamp<int64_t>(tokens, 0, static_cast<int64_t>(src.traj_.size()));
  LRA_RETURN_IF_ERROR(kv_->copy_prefix(*src.kv_, tokens, from));
  traj_.assign(src.traj_.begin(), src.traj_.begin() + tokens);
  if (keep_counts)
    for (size_t a = 0; a < from.size(); ++a)
      if (from[a] >= 0) {
        computed_[a] = src.computed_[static_cast<size_t>(from[a])];
        partial_[a] = src.partial_[static_cast<size_t>(from[a])];
      }
  return Status::Ok();
}

void AgentSession::truncate(int64_t tokens) {
  tokens = std::clamp<int64_t>(tokens, 0, static_cast<int64_t>(traj_.size()));
  traj_.resize(static_cast<size_t>(tokens));
  kv_->truncate(tokens);
}

// The newest marker decides, found from the back: a step pays for the tokens since its last
// marker only.
int64_t thinking_tokens(std::span<const int32_t> tokens, std::span<const int32_t> start, std::span<const int32_t> end,
                        int64_t open_before) {
  const auto at = [&](std::span<const int32_t> marker, size_t i) {
    return !marker.empty() && i + marker.size() <= tokens.size() &&
           std::equal(marker.begin(), marker.end(), tokens.begin() + static_cast<long>(i));
  };
  for (size_t i = tokens.size(); i-- > 0;) {
    if (at(end, i)) return -1;
    if (at(start, i)) return static_cast<int64_t>(tokens.size() - i - start.size());
  }
  return open_before < 0 ? -1 : open_before + static_cast<int64_t>(tokens.size());
}

// vLLM's logits processors on one row: before the penalties, logit_bias, allowed_token_ids,
// bad_words, the thinking budget (only the end marker's next id once it is spent) and
// min_tokens (the stop ids out while fewer than min_tokens are generated); after
// them (sampled rows only), min_p on the tempered distribution: p_i >= min_p * p_max  <=>
// logit_i >= max + T * ln(min_p).
void AgentSession::shape_logits(std::span<float> row, const AgentDecode& dec, std::span<const int32_t> generated,
                                bool before_penalties) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto vocab = static_cast<int64_t>(row.size());
  if (before_penalties) {
    for (const auto& [id, bias] : dec.logit_bias)
      if (id >= 0 && id < vocab) row[static_cast<size_t>(id)] += bias;
    if (!dec.allowed_ids.empty()) {  // every other id out, the stop ids too (as vLLM's processor)
      std::vector<float> kept;
      for (int32_t id : dec.allowed_ids) kept.push_back(id >= 0 && id < vocab ? row[static_cast<size_t>(id)] : neg_inf);
      std::fill(row.begin(), row.end(), neg_inf);
      for (size_t k = 0; k < kept.size(); ++k)
        if (dec.allowed_ids[k] >= 0 && dec.allowed_ids[k] < vocab) row[static_cast<size_t>(dec.allowed_ids[k])] = kept[k];
    }
    for (const std::vector<int32_t>& word : dec.bad_words) {
      // Its last id is out when the generated tokens end with the rest of it (vLLM's rule).
      if (word.empty() || word.size() - 1 > generated.size()) continue;
      const size_t prefix = word.size() - 1;
      if (std::equal(word.begin(), word.end() - 1, generated.end() - static_cast<long>(prefix)) && word.back() >= 0 &&
          word.back() < vocab)
        row[static_cast<size_t>(word.back())] = neg_inf;
    }
    if (dec.reasoning_budget >= 0 && !dec.reasoning_end.empty()) {
      const std::vector<int32_t>& end = dec.reasoning_end;
      if (thinking_tokens(generated, dec.reasoning_start, end, dec.reasoning_open) >= dec.reasoning_budget) {
        // The marker's next id: after the longest start of it the generated tokens end with.
        size_t k = std::min(end.size() - 1, generated.size());
        while (k > 0 && !std::equal(end.begin(), end.begin() + static_cast<long>(k), generated.end() - static_cast<long>(k)))
          --k;
        const int32_t next = end[k];
        if (next >= 0 && next < vocab) {
          const float keep = std::isfinite(row[static_cast<size_t>(next)]) ? row[static_cast<size_t>(next)] : 0.f;
          std::fill(row.begin(), row.end(), neg_inf);
          row[static_cast<size_t>(next)] = keep;
        }
        return;  // forced: min_tokens' stop-id ban cannot apply to a marker that is no stop id
      }
    }
    if (static_cast<int64_t>(generated.size()) < dec.min_tokens)
      for (int32_t id : dec.stop_ids)
        if (id >= 0 && id < vocab) row[static_cast<size_t>(id)] = neg_inf;
    return;
  }
  if (!(dec.min_p > 0.f) || !(dec.sampling.temperature > 0.f)) return;
  float mx = neg_inf;
  for (float x : row) mx = std::max(mx, x);
  const float floor = mx + dec.sampling.temperature * std::log(dec.min_p);
  for (float& x : row)
    if (x < floor) x = neg_inf;
}

Result<StepResult> AgentSession::run_agent(const std::string& name, int n_generate, const std::vector<int32_t>& forced,
                                           const std::vector<std::string>& stop, const AgentDecode* decode) {
  static const AgentDecode kReplayDecode;
  LRA_ASSIGN_OR_RETURN(std::unique_ptr<AgentTurn> turn,
                       AgentTurn::start(*this, name, n_generate, forced, stop, decode ? *decode : kReplayDecode));
  LRA_RETURN_IF_ERROR(turn->run_alone());
  return turn->result();
}

Status AgentSession::check_ids(const std::vector<int32_t>& ids, const char* what) const {
  const int vocab = model_.config().vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      return make_error(ErrorCode::kInvalidArgument, "{}: id {} is outside the vocabulary [0, {})", what, id, vocab);
  return Status::Ok();
}

Error AgentSession::nothing_to_forward(int a, int64_t begin) const {
  if (traj_.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "agent '{}' has nothing to read: the trajectory is empty (this model has no BOS token; append "
                      "text or tokens before the first agent step)",
                      names_[static_cast<size_t>(a)]);
  return make_error(ErrorCode::kInternal, "agent '{}' has nothing to forward at position {}", names_[static_cast<size_t>(a)],
                    begin);
}

Result<StepResult> AgentSession::run_step(const ReplayStep& st) {
  switch (st.kind) {
    case ReplayStep::Kind::kAppendText: {
      LRA_ASSIGN_OR_RETURN(auto ids, encode(st.text));
      append(ids);
      return StepResult{};
    }
    case ReplayStep::Kind::kAppendTokens:
      LRA_RETURN_IF_ERROR(check_ids(st.tokens, "append_tokens"));
      append(st.tokens);
      return StepResult{};
    case ReplayStep::Kind::kGenerate: return run_agent(st.agent, st.generate, {}, st.stop);
    case ReplayStep::Kind::kForce:
      // Every forced id, the last one too: it joins the trajectory without being forwarded here.
      LRA_RETURN_IF_ERROR(check_ids(st.tokens, "force_tokens"));
      return run_agent(st.agent, 0, st.tokens, {});
  }
  return make_error(ErrorCode::kInternal, "unknown step kind");
}

Result<ReplayResult> run_replay(LlamaModel& model, const Tokenizer* tok, std::vector<std::string> agent_names,
                                std::vector<const LoraAdapter*> adapters, const std::vector<ReplayStep>& steps,
                                const ReplayOptions& opts) {
  LRA_ASSIGN_OR_RETURN(auto session, AgentSession::create(model, tok, std::move(agent_names), std::move(adapters), opts));
  ReplayResult out;
  for (size_t i = 0; i < steps.size(); ++i) {
    auto r = session->run_step(steps[i]);
    if (!r.ok()) return make_error(r.error().code, "step {}: {}", i, r.error().message);
    if (opts.on_step) opts.on_step(i, *r);
    out.steps.push_back(std::move(*r));
  }
  out.trajectory = session->trajectory();
  out.cache = session->cache_bytes();
  out.kv_usage = session->kv().usage();
  out.computed_per_agent = session->computed_per_agent();
  out.partial_per_agent = session->partial_per_agent();
  return out;
}

}  // namespace lragent
