// What `lragent serve` and `lragent run-batch` share: the flags of the engine behind the
// OpenAI-compatible server (model, adapters, KV memory, sharing, parsers, sampling defaults), and
// the server built from them. The HTTP front end's flags (--host, --port, --api-key, CORS) are
// serve's own.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/sharing_flags.h"
#include "core/result.h"
#include "server/server.h"

namespace lragent::cli {

struct ServeFlags {
  ModelFlags model;
  SharingFlags sharing;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_names;  // --served-model-name: a request may name any; answers name the first
  int max_sessions = 0;  // 0: 256 when --gpu-memory-utilization sizes the KV memory, else 4
  const CLI::App* app = nullptr;  // which flags were given (--max-context's default depends on it)
  bool no_share_blocks = false;
  double kv_cache_memory_gb = 0;  // > 0: the server's one KV memory (SessionPoolOptions::pool_bytes)
  double gpu_memory_utilization = 0.9;  // > 0: that KV memory sized from the device (plan_kv_memory)
  bool gpu_memory_utilization_given = false;  // on the command line (else the default applies only on a GPU)
  int64_t max_batched_tokens = 2048;
  int64_t max_model_len = 0;
  std::string api_key;
  // vLLM's CORS flags: JSON lists (or comma-separated), every origin, method and header by default.
  std::string allowed_origins = "[\"*\"]", allowed_methods = "[\"*\"]", allowed_headers = "[\"*\"]";
  bool allow_credentials = false;
  bool trust_request_chat_template = false;  // vLLM's: a request's own chat_template is rendered
  int64_t max_stored_responses = 1024;
  std::string chat_template;  // a file holding a template (as vLLM's --chat-template)
  std::string tool_call_parser = "auto";  // hermes | llama3_json | mistral | deepseek_v3 | auto (the template's)
  std::string reasoning_parser;           // qwen3 | deepseek_r1 | empty (none)
  std::string generation_config = "auto";  // auto | vllm | a directory with a generation_config.json
  std::string override_generation_config;  // a JSON object over it
  bool vllm_enable_lora = false;       // --enable-lora: vLLM's; adapters are always served
  int max_lora_rank = 0;               // --max-lora-rank: vLLM's; > 0 refuses adapters of a higher rank
  bool runtime_lora = false;           // --enable-runtime-lora: POST /v1/load_lora_adapter and /v1/unload_lora_adapter
  bool vllm_auto_tool_choice = false;  // --enable-auto-tool-choice: vLLM's; tool calls are always parsed
  std::string preset;         // a synthetic model with a published model's shapes (benchmarks)
  int preset_rank = 16;
  std::string preset_adapters = "shared";
  bool quiet = false;
  // vLLM's command line, accepted where lragent does what it asks anyway.
  bool trust_remote_code = false;  // lragent runs no code from a model directory
  int tensor_parallel_size = 1;    // one device: only 1
  bool enable_prefix_caching = false;  // always on (kept trajectories)
  bool enable_chunked_prefill = false;  // always on (--max-num-batched-tokens)
  int max_loras = 1;                    // any: every pass mixes all served adapters
  int max_cpu_loras = 0;                // any: every adapter stays loaded
  bool disable_log_stats = false;       // lragent logs no periodic stats
  std::string kv_cache_dtype = "auto";  // only auto: the cache in the weights' dtype
  int64_t seed = -1;               // >= 0: the first seed of requests that give none (else drawn)
  bool return_tokens_as_token_ids = false;
  int max_logprobs = lragent::server::kDefaultMaxLogprobs;
  std::string scheduling_policy = "fcfs";  // fcfs | priority (vLLM's --scheduling-policy)
  bool request_id_headers = false;         // vLLM's --enable-request-id-headers
};

// Registers the engine's flags on `cmd` (which `f` must outlive) and sets f->app.
void add_engine_flags(CLI::App* cmd, ServeFlags* f);

// The model, its adapters and the server on them (the server first to go).
struct BuiltServer {
  LoadedModel loaded;
  std::unique_ptr<server::Server> server;
};
// Loads what `f` names and creates the server (not bound); prints what it chose on stderr.
Result<BuiltServer> build_server(const ServeFlags& f, server::CorsOptions cors);

}  // namespace lragent::cli
