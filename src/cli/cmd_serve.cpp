// `lragent serve`: the OpenAI-compatible server (server/server.h) on a model and its adapters.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/serve_setup.h"
#include "cli/sharing_flags.h"
#include "core/text_file.h"
#include "engine/memory_plan.h"
#include "kv/sharing.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "server/sampling_defaults.h"
#include "server/server.h"

namespace lragent::cli {
namespace {


// The chat template: --chat-template's (a file, or the template text itself, as vLLM takes it),
// else chat_template.jinja beside the model (where transformers >= 4.43 saves it), else
// tokenizer_config.json's; BOS from tokenizer_config.json. A model without one is no error (only
// /v1/chat/completions needs it: the reason is kept for that endpoint's answer) and neither is a
// model template lragent cannot render (a warning); a --chat-template it cannot use is.
Status set_chat_template(const ServeFlags& f, server::ServerOptions& so) {
  if (f.model.model_dir.empty() && f.chat_template.empty()) {
    so.chat_template_missing = "the built-in model has none";
    return Status::Ok();
  }
  const std::filesystem::path dir(f.model.tokenizer_source());  // vLLM reads the template from the tokenizer
  nlohmann::json cfg = nlohmann::json::object();
  if (!f.model.model_dir.empty()) {
    if (auto text = read_text_file((dir / "tokenizer_config.json").string()); text.ok()) {
      cfg = nlohmann::json::parse(*text, nullptr, false);
      if (!cfg.is_object()) cfg = nlohmann::json::object();
    }
  }
  std::string source = (dir / "tokenizer_config.json").string();
  std::error_code ec;
  if (!f.chat_template.empty()) {
    if (std::filesystem::is_regular_file(f.chat_template, ec)) {
      auto text = read_text_file(f.chat_template);
      if (!text.ok()) return make_error(text.error().code, "--chat-template {}", text.error().message);
      cfg["chat_template"] = *text;
      source = f.chat_template;
    } else if (f.chat_template.find("{{") != std::string::npos || f.chat_template.find("{%") != std::string::npos) {
      cfg["chat_template"] = f.chat_template;
      source = "--chat-template";
    } else {
      return make_error(ErrorCode::kNotFound, "--chat-template {}: no such file (give a template file or its text)",
                        f.chat_template);
    }
  } else if (std::filesystem::is_regular_file(dir / "chat_template.jinja", ec)) {
    auto text = read_text_file((dir / "chat_template.jinja").string());
    if (!text.ok()) return text.error();
    cfg["chat_template"] = *text;
    source = (dir / "chat_template.jinja").string();
  }
  auto t = server::ChatTemplate::from_tokenizer_config(cfg.dump(), source);
  if (t.ok()) {
    so.chat_template = *t;
    fmt::print(stderr, "chat template: {} ({}); tool calls: {}{}\n", server::chat_format_name(t->format), source,
               server::tool_call_format_name(so.tool_call_parser.value_or(t->tool_call_format)),
               so.tool_call_parser ? " (--tool-call-parser)" : "");
    return Status::Ok();
  }
  if (!f.chat_template.empty()) return t.error();  // asked for explicitly: it must work
  so.chat_template_missing = t.error().message;
  if (t.error().code != ErrorCode::kNotFound)
    fmt::print(stderr, "warning: {}; /v1/chat/completions is off\n", t.error().message);
  return Status::Ok();
}

server::Server* g_server = nullptr;  // for the signal handler

std::atomic<int64_t> g_first_signal_ns{0};  // when the first SIGINT/SIGTERM came (monotonic; 0: none yet)

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// The first signal closes the listening socket and lets the requests in flight finish (serve()
// returns once they have); a second quits at once, as uvicorn (vLLM's server) does, for when a
// long generation or a stalled client would hold the exit. A second delivery within 300 ms is the
// same signal twice (`timeout` signals the command and then its own process group), not a user
// asking again. Only async-signal-safe calls here.
void on_signal(int sig) {
  const int64_t now = monotonic_ns();
  int64_t first = 0;
  if (g_first_signal_ns.compare_exchange_strong(first, now)) {
    static const char msg[] = "stopping: finishing the requests in flight (Ctrl-C again quits at once)\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    if (g_server) g_server->stop();
    return;
  }
  if (now - first < 300'000'000) return;
  static const char msg[] = "quit with requests in flight\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
  ::_exit(128 + sig);
}

std::string default_served_name(const ModelFlags& m) {
  if (m.model_dir.empty()) return "synthetic";
  std::filesystem::path p(m.model_dir);
  if (p.filename().empty()) p = p.parent_path();  // "dir/" names "dir"
  return p.filename().string().empty() ? m.model_dir : p.filename().string();
}

// --preset: random weights with a published model's shapes, generated on the device, and the
// three role adapters of `bench trace`; the byte tokenizer of the built-in model (ids < 256), so
// text prompts work, and token-id prompts reach the whole vocabulary. For measuring the server.
Result<LoadedModel> load_preset(const ServeFlags& f) {
  LRA_ASSIGN_OR_RETURN(ModelPreset preset, model_preset(f.preset));
  LoadedModel out;
  LRA_ASSIGN_OR_RETURN(out.backend, make_backend(f.model));
  fmt::print(stderr, "preset {}: {} on {}\n", preset.name, preset.description, out.backend->name());
  LRA_ASSIGN_OR_RETURN(out.model, make_preset_model(preset, *out.backend));
  out.adapters = std::make_unique<AdapterRegistry>();
  for (auto& a : make_preset_adapters(preset.config, f.preset_rank, f.preset_adapters == "shared", /*seed=*/16)) {
    LRA_RETURN_IF_ERROR(upload_adapter(*a, *out.backend));
    LRA_RETURN_IF_ERROR(out.adapters->add(std::move(a)));
  }
  out.tokenizer = make_byte_tokenizer();
  out.synthetic = true;
  return out;
}

int run_serve(const ServeFlags& f) {
  auto origins = server::parse_cors_list(f.allowed_origins, "--allowed-origins");
  auto methods = server::parse_cors_list(f.allowed_methods, "--allowed-methods");
  auto headers = server::parse_cors_list(f.allowed_headers, "--allowed-headers");
  for (const auto* list : {&origins, &methods, &headers})
    if (!list->ok()) return report(list->error());
  server::CorsOptions cors{std::move(*origins), std::move(*methods), std::move(*headers), f.allow_credentials};
  auto built = build_server(f, std::move(cors));
  if (!built.ok()) return report(built.error());
  server::Server& s = *built->server;
  const server::ServerOptions& so = s.options();
  auto port = s.bind(f.host, f.port);
  if (!port.ok()) return report(port.error());
  std::string memory =
      s.kv_memory_bytes() > 0 ? fmt::format(", KV memory {:.2f} GB", s.kv_memory_bytes() / 1e9) : std::string();
  if (s.max_pass_tokens() > 0) memory += fmt::format(", passes of at most {} tokens", s.max_pass_tokens());
  std::vector<std::string> shown = s.model_names();  // the base model first, then the adapters
  if (!so.base_aliases.empty() && !shown.empty())
    shown.front() += fmt::format(" (also as {})", fmt::join(so.base_aliases, ", "));
  fmt::print(stderr, "serving {} on http://{}:{} (OpenAI API: /v1/models, /v1/completions{}; kv-share {}, up to {} "
                     "trajectories of {} tokens{}). Ctrl-C stops.\n",
             fmt::join(shown, ", "), f.host, *port, so.chat_template ? ", /v1/chat/completions, /v1/responses, /v1/messages" : "",
             share_mode_name(s.share_mode()), so.pool.max_sessions, s.max_model_len(), memory);
  if (so.runtime_lora)
    fmt::print(stderr, "runtime LoRA updating is on: POST /v1/load_lora_adapter and /v1/unload_lora_adapter{}\n",
               so.api_key.empty() ? " (no --api-key: any client can make the server read a directory)" : "");
  std::fflush(stderr);
  g_server = &s;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  Status st = s.serve();
  g_server = nullptr;
  if (!st.ok()) return report(st.error());
  fmt::print(stderr, "stopped\n");
  return 0;
}

}  // namespace

Result<BuiltServer> build_server(const ServeFlags& f, server::CorsOptions cors) {
  // The server's one KV memory, sized in GB or from the device, is every trajectory's.
  const bool util_given = f.gpu_memory_utilization_given && f.gpu_memory_utilization > 0;
  const char* sizing = f.kv_cache_memory_gb > 0 ? "--kv-cache-memory" : "--gpu-memory-utilization";
  if (f.kv_cache_memory_gb > 0 && util_given)
    return Error{ErrorCode::kInvalidArgument, "--kv-cache-memory and --gpu-memory-utilization both size the "
                                              "server's KV memory: give one of them"};
  if ((f.kv_cache_memory_gb > 0 || util_given) && (f.no_share_blocks || f.sharing.kv_memory_gb > 0))
    return Error{ErrorCode::kInvalidArgument,
                 fmt::format("{} sizes the one KV memory every trajectory shares: it cannot go with "
                                    "--no-share-blocks or --kv-memory (a KV memory per trajectory); drop one of them",
                                    sizing)};
  // Checked before the weights load: a mistyped flag fails at once. A --preset has no
  // generation_config.json; "auto" is then neutral.
  auto defaults = server::load_sampling_defaults(
      f.preset.empty() || f.generation_config != "auto" ? f.generation_config : "vllm", f.model.model_dir,
      f.override_generation_config);
  if (!defaults.ok()) return defaults.error();
  auto spec = speculative_options(f.model.speculative_config);
  if (!spec.ok()) return spec.error();
  auto loaded = f.preset.empty() ? load_model(f.model) : load_preset(f);
  if (!loaded.ok()) return loaded.error();
  BuiltServer built;
  built.loaded = std::move(*loaded);
  LoadedModel* model = &built.loaded;
  server::ServerOptions so;
  so.sampling_defaults = *defaults;
  if (f.seed >= 0) so.seed = static_cast<uint64_t>(f.seed);
  so.return_tokens_as_token_ids = f.return_tokens_as_token_ids;
  so.max_logprobs = f.max_logprobs;
  so.priority_scheduling = f.scheduling_policy == "priority";
  so.request_id_headers = f.request_id_headers;
  if (const std::string given = defaults->describe(); !given.empty())
    fmt::print(stderr, "default sampling parameters from the generation config: {} (a request's own values win; "
                       "--generation-config vllm for neutral defaults)\n",
               given);
  so.max_lora_rank = f.max_lora_rank;
  // vLLM turns runtime LoRA updating on from its environment; the flag says the same.
  const char* env_runtime = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
  const std::string env = env_runtime ? env_runtime : "";
  so.runtime_lora = f.runtime_lora || env == "True" || env == "true" || env == "1";
  so.base_name = !f.served_names.empty() ? f.served_names.front()
                 : !f.preset.empty()       ? f.preset
                                           : default_served_name(f.model);
  if (f.served_names.size() > 1) so.base_aliases.assign(f.served_names.begin() + 1, f.served_names.end());
  so.pool.share_blocks = !f.no_share_blocks;
  so.pool.pool_bytes = static_cast<int64_t>(f.kv_cache_memory_gb * 1e9);
  // The default fraction applies on a device with its own memory when nothing else sizes the KV
  // memory; given, it applies (and on the CPU is an error that says what to give instead).
  const bool other_sizing = f.kv_cache_memory_gb > 0 || f.no_share_blocks || f.sharing.kv_memory_gb > 0;
  const bool use_util = f.gpu_memory_utilization > 0 && !other_sizing &&
                        (util_given || model->model->backend().memory_stats().capacity > 0);
  if (use_util) {
    // Profiled with an adapter when there is one: the LoRA buffers of a pass count too.
    const LoraAdapter* probe =
        model->adapters && model->adapters->size() > 0 ? &model->adapters->at(0) : nullptr;
    // The largest pass: a prompt alone runs in chunks of this many tokens (ServerOptions::
    // max_pass_tokens), at least vLLM's 8192, so that its working memory is what was profiled.
    const int64_t pass = std::max<int64_t>(f.max_batched_tokens, 8192);
    auto plan = plan_kv_memory(*model->model, probe, f.gpu_memory_utilization, pass);
    if (!plan.ok() && util_given)
      return Error{plan.error().code, "--gpu-memory-utilization: " + plan.error().message};
    if (!plan.ok()) {  // the default: the reservation it would have capped is made as it is
      fmt::print(stderr, "warning: --gpu-memory-utilization {} (the default): {}; reserving --max-sessions "
                         "trajectories of --max-context instead\n",
                 f.gpu_memory_utilization, plan.error().message);
    } else {
      so.pool.pool_bytes = plan->kv_bytes;
      so.memory_plan = *plan;
      fmt::print(stderr,
                 "--gpu-memory-utilization {}: {:.2f} GB for the KV cache ({:.2f} GB of the device's {:.2f} GB, less "
                 "{:.2f} GB of weights and buffers and {:.2f} GB for a pass of {} tokens)\n",
                 f.gpu_memory_utilization, plan->kv_bytes / 1e9, f.gpu_memory_utilization * plan->device_bytes / 1e9,
                 plan->device_bytes / 1e9, plan->in_use / 1e9, plan->pass_peak / 1e9, plan->pass_tokens);
    }
  }
  so.max_batch_tokens = f.max_batched_tokens;
  so.pool.replay.decode_lookahead = !f.model.no_decode_lookahead;
  so.pool.replay.speculative = *spec;
  so.max_model_len = f.max_model_len;
  so.api_key = f.api_key;
  so.cors = std::move(cors);
  so.trust_request_chat_template = f.trust_request_chat_template;
  so.max_stored_responses = static_cast<size_t>(f.max_stored_responses);
  if (!f.quiet) so.log = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  so.warn = [](const std::string& line) { fmt::print(stderr, "warning: {}\n", line); };  // --quiet too
#ifdef __GLIBC__
  // A server runs for days. glibc raises its mmap threshold each time a large block is freed, so
  // the MB-sized buffers of later requests come from the heap, where freed space stays with the
  // process: RSS grew ~4 MB per 100-client storm (scripts/serve-stress.py). A fixed threshold
  // keeps such buffers in mmaps that go back on free, and the heap's free top goes back whenever
  // the engine falls idle.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  so.on_idle = [] { malloc_trim(0); };
#endif
  if (f.tool_call_parser != "auto") {
    auto format = server::parse_tool_call_format(f.tool_call_parser);
    if (!format.ok()) return Error{format.error().code, "--tool-call-parser: " + format.error().message + " (or auto)"};
    so.tool_call_parser = *format;
  }
  if (!f.reasoning_parser.empty()) {
    auto format = server::parse_reasoning_format(f.reasoning_parser);
    if (!format.ok()) return Error{format.error().code, "--reasoning-parser: " + format.error().message};
    so.reasoning_parser = *format;
  }
  if (f.preset.empty()) {
    if (Status st = set_chat_template(f, so); !st.ok()) return st.error();
  } else {
    so.chat_template_missing = "a --preset model has none";
  }

  // auto: base-lr when the adapters share their A matrices (one low-rank cache for all), else base;
  // none when the model norms its keys (Qwen3) and an adapter adapts k_proj.
  const bool is_auto = f.sharing.mode == "auto";
  if (!is_auto && !parse_share_mode(f.sharing.mode).ok())
    return Error{ErrorCode::kInvalidArgument, fmt::format("--kv-share '{}' is not a sharing mode; choose auto, {}",
                                                          f.sharing.mode, share_mode_choices())};
  auto sharing = f.sharing.options_for(is_auto ? "base-lr" : f.sharing.mode);
  if (!sharing.ok()) return sharing.error();
  so.pool.replay.sharing = *sharing;
  // With one KV memory of a size in bytes (taken from the device, or --kv-cache-memory: vLLM's
  // ways), the other defaults are vLLM's too: 256 requests at once (--max-num-seqs) and the
  // model's whole context; each trajectory then takes pages as it grows, the memory shared by all
  // (a trajectory is capped at --max-context, so the memory is at most --max-sessions of those).
  // Else 4 trajectories of --max-context, reserved. (Before session 38 --kv-cache-memory kept 4 x
  // 4096, which capped a memory of 40 GB at 9 GB and refused 8192-token conversations.)
  const bool bytes_sized = so.pool.pool_bytes > 0;
  so.pool.max_sessions = f.max_sessions > 0 ? f.max_sessions : bytes_sized ? 256 : 4;
  const int64_t model_context = model->model->config().max_position_embeddings;
  if (bytes_sized && model_context > 0 && f.app && f.app->count("--max-context") == 0)
    so.pool.replay.sharing.max_tokens = model_context;
  if (is_auto && model->adapters) {
    const std::vector<const LoraAdapter*> adapters = agents_of(*model->adapters).second;
    const ModelConfig& cfg = model->model->config();
    if (!check_low_rank_k(cfg, adapters, ShareMode::kBaseLr).ok()) {
      fmt::print(stderr, "--kv-share auto: {} norms its keys and an adapter adapts k_proj, so no low-rank cache can "
                         "hold that term; each agent keeps its own full cache (none)\n",
                 cfg.architecture);
      so.pool.replay.sharing.mode = ShareMode::kNone;
    } else if (!check_shared_a(adapters, cfg.num_layers).ok()) {
      fmt::print(stderr, "--kv-share auto: the adapters do not share lora_A, so each agent keeps its own low-rank "
                         "cache (base)\n");
      so.pool.replay.sharing.mode = ShareMode::kBase;
    }
  }
  auto srv = server::Server::create(*model->model, model->tokenizer.get(), model->adapters.get(), so);
  if (!srv.ok()) return srv.error();
  built.server = std::move(*srv);
  return built;
}

void add_engine_flags(CLI::App* cmd, ServeFlags* f) {
  f->model.add_to(cmd, true);
  add_speculative_flag(cmd, f->model.speculative_config);
  f->sharing.add_to(cmd, "auto",
                    "; auto (default here): base-lr when the adapters share lora_A, else base (none when a Qwen3 adapter "
                    "adapts k_proj). Here --max-context "
                    "and --kv-memory size each kept trajectory (--max-context defaults to the model's whole context "
                    "when --gpu-memory-utilization or --kv-cache-memory sizes the server's KV memory)");
  cmd->add_option("--served-model-name", f->served_names,
                  "Name(s) of the base model in the API (default: the --model directory's name; \"synthetic\" for "
                  "the built-in model). Several, as vLLM takes them (--served-model-name NAME OTHER ...): a request may "
                  "name any, answers name the first. Adapters are served under their --adapter names")
      ->expected(1, -1);
  cmd->add_option("--max-sessions,--max-num-seqs", f->max_sessions,
                  "Trajectories kept between requests, each growing up to --max-context in the server's KV memory "
                  "(--gpu-memory-utilization, --kv-cache-memory; or --kv-memory each); the least recently used one "
                  "makes room for a new one. Requests on different trajectories run batched together, so this also "
                  "bounds how many run at once, as vLLM's --max-num-seqs (a request whose trajectory another one "
                  "runs starts on a copy of it when a slot is free, else waits; the copy shares its source's KV "
                  "pages, see --no-share-blocks). 0 (default): 256 when --gpu-memory-utilization (on a GPU) or "
                  "--kv-cache-memory sizes the KV memory, else 4")
      ->default_val(0)
      ->check(cli::in_range(0, 4096));
  cmd->add_option("--kv-cache-memory", f->kv_cache_memory_gb,
                  "KV cache memory of the whole server in GB (vLLM's --kv-cache-memory), shared by every "
                  "trajectory: each takes blocks as it grows, up to --max-context, so that --max-sessions requests can "
                  "run at once without each reserving its --max-context up front. When it fills, idle trajectories "
                  "are dropped, then the request that came last is preempted: its trajectory gives back what the "
                  "request added to it, and it resumes by recomputing that once there is room (as vLLM preempts by "
                  "recompute; lragent:num_preemptions_total counts them). Given, the defaults are vLLM's: "
                  "--max-sessions 256 and --max-context the model's whole context. 0 (default): on a GPU "
                  "--gpu-memory-utilization sizes it; else --max-sessions trajectories of --max-context each, "
                  "reserved at start-up, so that none ever waits for memory")
      ->default_val(0)
      ->check(cli::memory_gb());
  cmd->add_option("--gpu-memory-utilization", f->gpu_memory_utilization,
                  "On a GPU, size the KV memory (--kv-cache-memory) from the device (vLLM's flag and default): the "
                  "fraction of the device's memory the server may use, in (0, 1]; the KV memory is what that leaves "
                  "once the weights, the adapters and one pass of max(--max-num-batched-tokens, 8192) tokens "
                  "(measured by running one at start-up; no pass runs more) are counted, and at most --max-sessions trajectories of --max-context. Sized so, "
                  "the defaults are vLLM's too: --max-sessions 256 and --max-context the model's whole context. "
                  "Unused when --kv-cache-memory, --kv-memory or --no-share-blocks is given, and on the CPU. 0: "
                  "--max-sessions (default 4) trajectories of --max-context (default 4096) reserved at start-up, "
                  "whatever the device holds")
      ->default_val(0.9)
      ->check(CLI::Range(0.0, 1.0))
      ->each([f](const std::string&) { f->gpu_memory_utilization_given = true; });
  cmd->add_flag("--no-share-blocks", f->no_share_blocks,
                "Give each trajectory a KV memory of its own, so that a copy of another's prefix (parallel agents on "
                "one prompt, a conversation that parts from another) stores that prefix again instead of sharing its "
                "blocks (copy-on-write); the copies then decode over their own blocks (for measuring; --kv-memory "
                "does the same)");
  cmd->add_option("--max-num-batched-tokens", f->max_batched_tokens,
                  "Tokens of one batched forward pass (vLLM's flag): every running request's next token, then "
                  "prompts in chunks of what is left, so a long prompt does not stall the others' decoding (with "
                  "nothing decoding, a prompt runs in one pass; when --gpu-memory-utilization sizes the memory, "
                  "in chunks of at most the pass it profiled, max(this, 8192), plus what the memory it planned "
                  "for the KV cache and left unused holds, as the start-up line says)")
      ->default_val(2048)
      ->check(cli::in_range(1, 1 << 20));
  cmd->add_option("--max-model-len", f->max_model_len,
                  "Longest prompt + max_tokens a request may ask for (0: --max-context); capped at the model's "
                  "context and at what one trajectory's --kv-memory holds (measured at start-up). Longer requests "
                  "get HTTP 400")
      ->default_val(0)
      ->check(cli::non_negative());
  cmd->add_option("--max-stored-responses", f->max_stored_responses,
                  "Responses API: how many responses (\"store\": true, the default) are kept in memory for GET "
                  "/v1/responses/{id} and previous_response_id, the least recently used dropped first (also past "
                  "256 MB of them), and how many \"background\": true responses run at once; 0 keeps none (and "
                  "serves no background responses)")
      ->default_val(1024)
      ->check(cli::non_negative());
  cmd->add_option("--chat-template", f->chat_template,
                  "Chat template for /v1/chat/completions: a file or the template text (default: the model's "
                  "chat_template.jinja, else tokenizer_config.json's). "
                  "Rendered as transformers' apply_chat_template renders it (lragent's Jinja interpreter; the "
                  "Llama-3-Instruct and Qwen3 templates, recognised by their exact text, in C++). A --chat-template "
                  "that cannot be parsed stops start-up; a model's own one leaves /v1/chat/completions answering 400 "
                  "with the reason");
  cmd->add_flag("--trust-request-chat-template", f->trust_request_chat_template,
                "Render a chat request's own \"chat_template\" (vLLM's flag; also /tokenize's): any client may then "
                "run any Jinja template on the server. Without it such a request gets HTTP 400");
  cmd->add_option("--tool-call-parser", f->tool_call_parser,
                  "How the model writes tool calls, so how a chat completion's calls are read out of its text and "
                  "what a forced tool_choice makes it write (vLLM's parsers): hermes (<tool_call>{...}</tool_call>: "
                  "Qwen2.5, Qwen3, Hermes), llama3_json ({\"name\", \"parameters\"} objects: Llama 3.1-3.3), mistral "
                  "([TOOL_CALLS][...]: Mistral), deepseek_v3 (<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME and a "
                  "```json block: DeepSeek-V3, R1 and its Llama and Qwen distills), pythonic ([f(a=1), g()]: Llama 3.2 "
                  "and 4 with pythonic templates; llama4_pythonic is the same), or auto: the form the chat template shows the model (a Llama-3 "
                  "template's is llama3_json; hermes when it shows none). Calls are parsed whenever a request gives tools (no --enable-auto-tool-choice "
                  "needed)")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "hermes", "llama3_json", "mistral", "deepseek_v3", "pythonic", "llama4_pythonic"}));
  cmd->add_option("--reasoning-parser", f->reasoning_parser,
                  "Hand a thinking model's reasoning to the client apart (vLLM's parsers): qwen3 or deepseek_r1. "
                  "A chat completion's <think>...</think> becomes the message's reasoning_content (and "
                  "\"reasoning\", vLLM's newer name), streamed as such deltas, and tool calls are parsed from the "
                  "answer after it. qwen3: no reasoning when the request sets chat_template_kwargs.enable_thinking "
                  "false. Default: none, the text is left whole")
      ->check(CLI::IsMember({"qwen3", "deepseek_r1"}));
  cmd->add_option("--generation-config", f->generation_config,
                  "Where a request's sampling defaults come from (vLLM's flag): auto, the model's "
                  "generation_config.json (its temperature, top_p, top_k, min_p and repetition_penalty become the "
                  "defaults for requests that leave them out, and its max_new_tokens caps every request's max_tokens; "
                  "values equal to transformers' defaults are not taken, as vLLM reads them); vllm, OpenAI's neutral "
                  "defaults (temperature 1, no top_p/top_k/min_p); or a directory holding a generation_config.json")
      ->default_val("auto");
  cmd->add_option("--override-generation-config", f->override_generation_config,
                  "A JSON object of those keys set over the generation config (vLLM's flag), e.g. "
                  "'{\"temperature\": 0.5, \"max_new_tokens\": 256}'");
  cmd->add_flag("--quiet,--disable-log-requests", f->quiet,
                "No access log on stderr (--disable-log-requests is vLLM's name)");
  cmd->add_option("--seed", f->seed,
                  "The seed of the first request that gives none, the next one's seed + 1, and so on (vLLM's flag), "
                  "so a run of unseeded requests repeats; default: drawn at start")
      ->check(cli::non_negative());
  cmd->add_option("--max-logprobs", f->max_logprobs,
                  "The most log-probabilities a request may ask for per token ('logprobs', 'top_logprobs', "
                  "'prompt_logprobs'); a request asking for more gets a 400. -1: no limit but the vocabulary (vLLM's flag)")
      ->default_val(lragent::server::kDefaultMaxLogprobs)
      ->check(CLI::Range(-1, lragent::server::kLogprobsLimit));
  cmd->add_option("--scheduling-policy", f->scheduling_policy,
                  "Which waiting request starts first (vLLM's flag): fcfs, in arrival order; or priority, by each "
                  "request's \"priority\" field (lower first, arrival order among equals; e.g. an orchestrator's "
                  "critical-path agent before background ones), the KV memory running out then preempting the "
                  "highest value first. Under fcfs a request's priority must be 0")
      ->default_val("fcfs")
      ->check(CLI::IsMember({"fcfs", "priority"}));
  cmd->add_flag("--return-tokens-as-token-ids", f->return_tokens_as_token_ids,
                "Name every logprobs token \"token_id:<id>\" instead of its text (vLLM's flag; a request's "
                "return_tokens_as_token_ids does the same for itself)");
  cmd->add_flag("--trust-remote-code", f->trust_remote_code,
                "Accepted for vLLM's command lines: lragent runs no code from a model directory (its architectures "
                "are built in)");
  cmd->add_option("--tensor-parallel-size", f->tensor_parallel_size,
                  "Accepted for vLLM's command lines: lragent runs a model on one device, so only 1")
      ->default_val(1)
      ->check(CLI::Range(1, 1).description("1 (one device)"));
  cmd->add_flag("--enable-prefix-caching", f->enable_prefix_caching,
                "Accepted for vLLM's command lines: requests always reuse the KV cache of the prompts they extend "
                "(the kept trajectories, --max-sessions)");
  cmd->add_flag("--enable-chunked-prefill", f->enable_chunked_prefill,
                "Accepted for vLLM's command lines: a prompt always runs in chunks within --max-num-batched-tokens, "
                "beside the running requests' decode tokens");
  cmd->add_option("--max-loras", f->max_loras,
                  "Accepted for vLLM's command lines (its most adapters in one batch): every lragent pass mixes all "
                  "served adapters, each sequence applying its own, so no request waits for an adapter slot")
      ->default_val(1)
      ->check(cli::positive());
  cmd->add_option("--max-cpu-loras", f->max_cpu_loras,
                  "Accepted for vLLM's command lines: every served adapter stays loaded (unload one with "
                  "/v1/unload_lora_adapter)")
      ->check(cli::positive());
  cmd->add_flag("--disable-log-stats", f->disable_log_stats,
                "Accepted for vLLM's command lines: lragent logs no periodic statistics (GET /metrics has them)");
  cmd->add_option("--kv-cache-dtype", f->kv_cache_dtype,
                  "vLLM's: only auto, the KV cache in the weights' dtype (--dtype); lragent has no fp8 caches")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto"}));
  auto* preset = cmd->add_option("--preset", f->preset,
                                 "Serve a synthetic model with the shapes of llama3.1-8b, ministral-8b, qwen3-8b or tiny (random "
                                 "weights made on the device, byte tokenizer) and bench trace's plan/action/reflect "
                                 "adapters, instead of --model: for measuring the server");
  // vLLM's command line: `vllm serve MODEL --enable-lora --lora-modules NAME=DIR ... --enable-auto-tool-choice`.
  auto* positional = cmd->add_option("model_dir", f->model.model_dir,
                                     "The model directory, as --model (vLLM's `serve MODEL` form)");
  positional->excludes("--model");
  preset->excludes("--model")->excludes("--adapter")->excludes(positional);
  cmd->add_flag("--enable-lora", f->vllm_enable_lora,
                "Accepted for vLLM's command lines: lragent always serves the --adapter / --lora-modules given");
  cmd->add_option("--max-lora-rank", f->max_lora_rank,
                  "vLLM's: refuse an adapter of a higher LoRA rank, at start and when loaded at run time (0, the "
                  "default: any rank; lragent sizes every cache from the adapters themselves)")
      ->default_val(0)
      ->check(cli::non_negative());
  cmd->add_flag("--enable-runtime-lora", f->runtime_lora,
                "Serve POST /v1/load_lora_adapter {\"lora_name\", \"lora_path\"} and /v1/unload_lora_adapter "
                "{\"lora_name\"} (vLLM's runtime LoRA updating; VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in the "
                "environment does the same). A loaded adapter is served at once under its name and shares the "
                "other agents' KV cache. Any client that may call /v1 can then make the server read a directory on "
                "its disk: use --api-key");
  cmd->add_flag("--enable-auto-tool-choice", f->vllm_auto_tool_choice,
                "Accepted for vLLM's command lines: a chat request with tools always has its tool calls parsed "
                "(tool_choice auto, the default with tools)");
  cmd->add_option("--preset-rank", f->preset_rank, "--preset adapters' LoRA rank")->default_val(16)->check(cli::in_range(1, 256));
  cmd->add_option("--preset-adapters", f->preset_adapters, "--preset adapters: shared (one A per layer and module) or independent")
      ->default_val("shared")
      ->check(CLI::IsMember({"shared", "independent"}));
  f->app = cmd;
}

void register_serve(CLI::App& app, std::function<int()>& action) {
  static ServeFlags flags;
  ServeFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server (as vLLM's): the base model and each --adapter are models of /v1/completions "
      "and /v1/chat/completions (and OpenAI's Responses API, /v1/responses, and Anthropic's Messages API, "
      "/v1/messages); "
      "requests whose prompts extend one trajectory share its KV cache across adapters. Also GET /health, "
      "GET /v1/models, POST /tokenize, POST /detokenize, GET /lragent/sessions, GET /metrics (Prometheus); "
      "docs/server.md has every field");
  add_engine_flags(cmd, f);
  cmd->add_option("--host", f->host, "Address to listen on (0.0.0.0: every interface)")->default_val("127.0.0.1");
  cmd->add_option("--port", f->port, "TCP port (0: any free port, printed at start)")
      ->default_val(8000)
      ->check(cli::in_range(0, 65535));
  cmd->add_option("--api-key", f->api_key, "Require \"Authorization: Bearer KEY\" on every /v1 request");
  cmd->add_option("--allowed-origins", f->allowed_origins,
                  "Origins whose web pages may call the server from a browser (CORS, vLLM's flag): a JSON list "
                  "('[\"https://app.example\"]') or comma-separated; \"*\" any. Answers with another Origin carry no "
                  "Access-Control-Allow-Origin, so the browser hides them from the page")
      ->default_val("[\"*\"]");
  cmd->add_option("--allowed-methods", f->allowed_methods,
                  "HTTP methods a cross-origin page may use (CORS preflights; vLLM's flag): a JSON list or "
                  "comma-separated; \"*\" any")
      ->default_val("[\"*\"]");
  cmd->add_option("--allowed-headers", f->allowed_headers,
                  "Request headers a cross-origin page may send (CORS preflights; vLLM's flag): a JSON list or "
                  "comma-separated; \"*\" any. Accept, Accept-Language, Content-Language and Content-Type always")
      ->default_val("[\"*\"]");
  cmd->add_flag("--allow-credentials", f->allow_credentials,
                "Let cross-origin pages send cookies and HTTP authentication (CORS's "
                "Access-Control-Allow-Credentials; vLLM's flag): preflights then name the allowed origin instead of \"*\", as "
                "answers to requests that send cookies always do");
  cmd->add_flag("--enable-request-id-headers", f->request_id_headers,
                "Answer every request with an X-Request-Id header (vLLM's flag): the request's own X-Request-Id, "
                "else a random one; a completion's is the id its answer is named by (\"cmpl-<id>\", \"chatcmpl-<id>\", "
                "from X-Request-Id or the body's request_id whether or not this is given)");
  cmd->callback([f, &action] { action = [f] { return run_serve(*f); }; });
}

}  // namespace lragent::cli
