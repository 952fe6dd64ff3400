// Shared pieces of the CLI commands: loading the model/tokenizer/adapters named by flags.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "engine/speculative.h"
#include "model/llama.h"
#include "model/lora.h"
#include "tokenizer/tokenizer.h"

namespace lragent::cli {

// --model / --threads / --adapter flags shared by generate, replay, run, ...
struct ModelFlags {
  std::string model_dir;  // empty: the built-in synthetic model
  std::string tokenizer_dir;  // --tokenizer: tokenizer.json (and tokenizer_config.json) from there; empty: model_dir
  int threads = 0;
  std::string device = "cpu";         // cpu | cuda | cuda:N
  std::string dtype = "bf16";         // CUDA weights and caches: bf16 | f32
  bool enforce_eager = false;         // CUDA: no graphs for decode steps
  bool no_decode_lookahead = false;   // decode step by step (EngineOptions / ReplayOptions::decode_lookahead)
  std::string prefill_attention = "v6";  // CUDA: prefill attention kernel, v6 | v5
  std::vector<std::string> adapters;  // NAME=DIR
  std::string speculative_config;     // --speculative-config JSON (commands that add_speculative_flag); empty: off
  // decodes: the command decodes tokens step by step (--no-decode-lookahead applies).
  void add_to(CLI::App* app, bool with_adapters, bool decodes = true);
  // Where the tokenizer's files are: --tokenizer, else the model directory.
  const std::string& tokenizer_source() const { return tokenizer_dir.empty() ? model_dir : tokenizer_dir; }
};

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the checkpoint has no tokenizer.json
  std::unique_ptr<AdapterRegistry> adapters;
  bool synthetic = false;
};

// --prefill-attention v6|v5 (ModelFlags has it; commands with their own device flags add it too).
// --no-decode-lookahead (sets `off`).
void add_decode_lookahead_flag(CLI::App* app, bool& off);
// --speculative-config JSON (vLLM's; the ngram and suffix methods): decode passes check drafts.
void add_speculative_flag(CLI::App* app, std::string& json);
// The options of that flag's value (empty: off); errors name the flag.
Result<SpeculativeOptions> speculative_options(const std::string& json);
void add_prefill_attention_flag(CLI::App* app, std::string& value);
// --threads N, 0 (all cores) to 1024.
void add_threads_flag(CLI::App* app, int& threads);

// The backend --device / --dtype / --threads name.
Result<std::unique_ptr<Backend>> make_backend(const ModelFlags& flags);

// Loads everything the flags name; prints progress on stderr.
Result<LoadedModel> load_model(const ModelFlags& flags);

// Parses "1,2,3" into ids.
Result<std::vector<int32_t>> parse_id_list(const std::string& text);

// Numeric option checks with a readable message ("must be >= 0, not -1"): CLI11 2.1's
// NonNegativeNumber / PositiveNumber print their range up to 1.8e308 in full.
CLI::Validator non_negative();
CLI::Validator positive();
// Finite and within [min, max] (NaN fails, unlike CLI::Range).
CLI::Validator in_range(double min, double max);
// A memory size in GB: finite, >= 0 and at most 1e6 (bytes then fit an int64).
CLI::Validator memory_gb();

// Prints "error: <message>" on stderr and returns the exit code for it.
int report(const Error& e);

}  // namespace lragent::cli
