// `lragent generate`: one prompt through the model (optionally with an adapter).
#include <algorithm>
#include <cstdio>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/text_file.h"
#include "engine/generator.h"
#include "engine/guide/json_regex.h"
#include "engine/guide/token_guide.h"

namespace lragent::cli {
namespace {

struct GenerateFlags {
  ModelFlags model;
  std::string prompt, prompt_tokens, use;
  int max_tokens = 64;
  float temperature = 0.f, top_p = 1.f;
  int top_k = 0;
  uint64_t seed = 0;
  bool json = false, logits = false, ignore_eos = false, keep_special = false;
  bool prompt_tokens_given = false;  // --prompt-tokens was on the command line (even empty)
  // Structured output, at most one (llama.cpp's --grammar / --grammar-file / --json-schema;
  // vLLM's regex).
  std::string grammar, grammar_file, json_schema, json_schema_file, regex;
};

// The guide the flags ask for (null: free text), over `trie` (built here when one is needed).
Result<std::unique_ptr<guide::TokenGuide>> make_guide(const GenerateFlags& f, const Tokenizer* tok,
                                                      std::unique_ptr<guide::VocabTrie>& trie) {
  const bool any = !f.grammar.empty() || !f.grammar_file.empty() || !f.json_schema.empty() ||
                   !f.json_schema_file.empty() || !f.regex.empty();
  if (!any) return std::unique_ptr<guide::TokenGuide>();
  if (!tok)
    return make_error(ErrorCode::kInvalidArgument,
                      "structured output needs the model's tokenizer.json (to know the text of each token), which "
                      "this model lacks");
  trie = guide::VocabTrie::build(*tok);
  // Errors name the flag, then the cause (line and column for a grammar).
  auto named = [](const char* flag, Result<std::unique_ptr<guide::TokenGuide>> g) {
    if (!g.ok()) return Result<std::unique_ptr<guide::TokenGuide>>(Error{g.error().code, fmt::format("{}: {}", flag, g.error().message)});
    return g;
  };
  if (!f.grammar.empty()) return named("--grammar", guide::TokenGuide::compile_grammar(f.grammar, "root", *trie));
  if (!f.grammar_file.empty()) {
    LRA_ASSIGN_OR_RETURN(std::string text, read_text_file(f.grammar_file));
    return named("--grammar-file", guide::TokenGuide::compile_grammar(text, "root", *trie));
  }
  if (!f.regex.empty()) return named("--regex", guide::TokenGuide::compile(f.regex, *trie));
  std::string schema_text = f.json_schema;
  const char* flag = "--json-schema";
  if (!f.json_schema_file.empty()) {
    LRA_ASSIGN_OR_RETURN(schema_text, read_text_file(f.json_schema_file));
    flag = "--json-schema-file";
  }
  const auto schema = nlohmann::ordered_json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded())
    return make_error(ErrorCode::kInvalidArgument, "{}: not JSON: give a JSON schema like '{{\"type\": \"object\"}}'", flag);
  auto re = guide::json_schema_regex(schema);
  if (!re.ok()) return Error{re.error().code, fmt::format("{}: {}", flag, re.error().message)};
  return named(flag, guide::TokenGuide::compile(*re, *trie));
}

int run_generate(const GenerateFlags& f) {
  auto spec = speculative_options(f.model.speculative_config);
  if (!spec.ok()) return report(spec.error());
  auto loaded = load_model(f.model);
  if (!loaded.ok()) return report(loaded.error());
  LoadedModel& lm = *loaded;

  GenerateRequest req;
  if (f.prompt_tokens_given) {
    if (f.prompt_tokens.empty())
      return report(make_error(ErrorCode::kInvalidArgument, "--prompt-tokens is empty: give ids like 1,450,3"));
    auto ids = parse_id_list(f.prompt_tokens);
    if (!ids.ok()) return report(ids.error());
    req.prompt = *ids;
  } else {
    if (!lm.tokenizer)
      return report(make_error(ErrorCode::kNotFound, "{} has no tokenizer.json: pass --prompt-tokens instead of --prompt",
                               f.model.model_dir));
    auto ids = lm.tokenizer->encode(f.prompt);
    if (!ids.ok()) return report(ids.error());
    req.prompt = std::move(*ids);
  }
  if (!f.use.empty()) {
    req.adapter = lm.adapters->find(f.use);
    if (!req.adapter)
      return report(make_error(ErrorCode::kNotFound, "--use {}: no adapter of that name (register it with --adapter {}=DIR)",
                               f.use, f.use));
  }
  std::unique_ptr<guide::VocabTrie> trie;  // outlives the guide, which reads it
  auto guided = make_guide(f, lm.tokenizer.get(), trie);
  if (!guided.ok()) return report(guided.error());
  req.guide = guided->get();
  req.max_tokens = f.max_tokens;
  req.sampling = {f.temperature, f.top_k, f.top_p, f.seed};
  req.keep_first_logits = f.logits;
  if (!f.ignore_eos) req.stop_ids = lm.model->config().eos_token_ids;

  EngineOptions eo;
  eo.decode_lookahead = !f.model.no_decode_lookahead;
  eo.speculative = *spec;
  Generator gen(*lm.model, eo);
  const bool stream = !f.json && lm.tokenizer;
  std::optional<StreamDecoder> stream_dec;  // only with a tokenizer to decode with
  // Decoded after the prompt's last token, as vLLM decodes a completion: a leading space stays.
  auto decoder = [&] {
    StreamDecoder d(*lm.tokenizer);
    d.prime(req.prompt.back());
    return d;
  };
  if (stream) stream_dec.emplace(decoder());
  // The stop token ends the output: its id is kept, its text is not shown; nor is any other
  // special token's unless --keep-special-tokens (vLLM's skip_special_tokens, default true).
  auto is_stop = [&](int32_t tok) { return std::find(req.stop_ids.begin(), req.stop_ids.end(), tok) != req.stop_ids.end(); };
  auto hidden = [&](int32_t tok) { return !f.keep_special && lm.tokenizer && lm.tokenizer->is_special(tok); };
  auto result = gen.run({req}, [&](size_t, int32_t tok) {
    if (stream && !is_stop(tok) && !hidden(tok)) {
      std::string piece = stream_dec->push(tok);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  });
  if (!result.ok()) return report(result.error());
  const GenerateResult& r = (*result)[0];
  if (f.json) {
    nlohmann::json j;
    j["prompt_tokens"] = req.prompt;
    j["output_tokens"] = r.output;
    std::vector<int32_t> shown = r.output;
    if (r.finish_reason == "stop" && !shown.empty() && is_stop(shown.back())) shown.pop_back();  // not a guide's end
    std::erase_if(shown, hidden);
    if (lm.tokenizer) {
      StreamDecoder d = decoder();
      std::string text;
      for (int32_t t : shown) text += d.push(t);
      j["text"] = text + d.finish();
    } else {
      j["text"] = nullptr;
    }
    j["finish_reason"] = r.finish_reason;
    if (!f.use.empty()) j["adapter"] = f.use;
    if (f.logits) j["last_logits"] = r.first_logits;
    if (r.drafts.passes > 0)
      j["speculative"] = r.drafts;
    std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    fmt::print("{}\n", s);
  } else if (stream) {
    std::string tail = stream_dec->finish();
    fmt::print("{}\n", tail);
  } else {
    fmt::print("{}\n", fmt::join(r.output, ","));
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, std::function<int()>& action) {
  static GenerateFlags flags;  // CLI11 binds flags by reference: they must outlive parse()
  GenerateFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand("generate", "Generate a continuation of a prompt");
  f->model.add_to(cmd, true);
  add_speculative_flag(cmd, f->model.speculative_config);
  auto* p = cmd->add_option("--prompt", f->prompt, "Prompt text (tokenized with the model's tokenizer, BOS added as HF does)");
  auto* pt = cmd->add_option("--prompt-tokens", f->prompt_tokens, "Prompt as comma-separated token ids, used as given (no BOS added)");
  p->excludes(pt);
  cmd->add_option("--max-tokens", f->max_tokens, "Tokens to generate")->default_val(64)->check(cli::non_negative());
  cmd->add_option("--temperature", f->temperature, "Sampling temperature; 0 is greedy")->default_val(0)->check(cli::non_negative());
  cmd->add_option("--top-p", f->top_p, "Nucleus sampling mass (1: off)")->default_val(1)->check(cli::in_range(0.0, 1.0));
  cmd->add_option("--top-k", f->top_k, "Keep only the k most likely tokens (0: off)")->default_val(0)->check(cli::non_negative());
  cmd->add_option("--seed", f->seed, "Random seed for sampling")->default_val(0)->check(cli::non_negative());
  cmd->add_option("--use", f->use, "Name of a registered adapter to generate with (default: base model)");
  auto* json = cmd->add_flag("--json", f->json,
                             "Print one JSON object: prompt_tokens, output_tokens (with the stop token, if one ended "
                             "the output), text (without it and other special tokens, decoded after the prompt as "
                             "vLLM decodes a completion), finish_reason (stop: a stop token or a structured output's "
                             "end; length: --max-tokens)");
  cmd->add_flag("--logits", f->logits,
                "With --json: add last_logits, the logits at the prompt's last position (the first generated token's "
                "distribution)")
      ->needs(json);
  cmd->add_flag("--ignore-eos", f->ignore_eos,
                "Do not stop at the end-of-sequence tokens (config.json's and generation_config.json's eos_token_id)");
  cmd->add_flag("--keep-special-tokens", f->keep_special,
                "Show special tokens (e.g. <|eot_id|>) in the text; by default they are left out, as vLLM's "
                "skip_special_tokens does (their ids stay in output_tokens)");
  // Structured output: the text is held to a language as it is generated (vLLM's guided decoding,
  // llama.cpp's grammars; docs/server.md, Structured outputs).
  auto* g = cmd->add_option("--grammar", f->grammar,
                            "Hold the output to a GBNF grammar (llama.cpp's format, start rule root), e.g. "
                            "'root ::= \"yes\" | \"no\"'; the output ends at a whole match nothing extends");
  auto* gf = cmd->add_option("--grammar-file", f->grammar_file, "--grammar, read from a file (e.g. a .gbnf)");
  auto* js = cmd->add_option("--json-schema", f->json_schema,
                             "Hold the output to a JSON document valid under this JSON schema, e.g. "
                             "'{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}}}' "
                             "(keywords: src/engine/guide/json_regex.h); '{}' for any JSON value");
  auto* jsf = cmd->add_option("--json-schema-file", f->json_schema_file, "--json-schema, read from a file");
  auto* re = cmd->add_option("--regex", f->regex, "Hold the output to a whole match of this regular expression");
  const std::vector<CLI::Option*> structured = {g, gf, js, jsf, re};
  for (CLI::Option* a : structured)
    for (CLI::Option* b : structured)
      if (a != b) a->excludes(b);
  cmd->callback([f, p, pt, &action] {
    f->prompt_tokens_given = pt->count() > 0;
    if (p->count() == 0 && pt->count() == 0)
      throw CLI::ValidationError("generate", "one of --prompt or --prompt-tokens is required");
    action = [f] { return run_generate(*f); };
  });
}

}  // namespace lragent::cli
