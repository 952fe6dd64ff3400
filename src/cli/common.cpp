#include "cli/common.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "model/synthetic.h"

namespace lragent::cli {

void ModelFlags::add_to(CLI::App* app, bool with_adapters, bool decodes) {
  app->add_option("--model", model_dir,
                  "Hugging Face model directory (config.json, *.safetensors, tokenizer.json). "
                  "Omitted: the built-in synthetic model (random weights, meaningless text)");
  app->add_option("--tokenizer", tokenizer_dir,
                  "Directory with the tokenizer.json (and tokenizer_config.json: its chat template, special tokens) to "
                  "use instead of the model directory's (vLLM's --tokenizer); needs --model");
  add_threads_flag(app, threads);
  app->add_option("--device", device,
                  "Where the model runs: cpu, or cuda / cuda:N (an NVIDIA GPU; needs a build with -DLRAGENT_CUDA=ON)")
      ->default_val("cpu");
  // vLLM's names too: auto (bf16, which the Llama-family checkpoints are), bfloat16, float32, float.
  app->add_option("--dtype", dtype,
                  "With --device cuda: bf16 (weights and KV caches in bf16, f32 accumulation; fast) or f32 (the CPU's "
                  "arithmetic, for exact comparisons); vLLM's auto and bfloat16 are bf16, float32 and float are f32 "
                  "(no float16)")
      ->default_val("bf16")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, std::string>{
              {"bf16", "bf16"}, {"auto", "bf16"}, {"bfloat16", "bf16"}, {"f32", "f32"}, {"float32", "f32"}, {"float", "f32"}},
          CLI::ignore_case));
  app->add_flag("--enforce-eager", enforce_eager,
                "With --device cuda: launch decode steps op by op instead of replaying them as CUDA graphs "
                "(slower; for debugging and profiling)");
  add_prefill_attention_flag(app, prefill_attention);
  if (decodes) add_decode_lookahead_flag(app, no_decode_lookahead);
  if (with_adapters)
    app->add_option("--adapter,--lora-modules", adapters,
                    "Register a PEFT LoRA adapter as NAME=DIR (adapter_config.json + adapter_model.safetensors); "
                    "repeatable, several after one flag too. --lora-modules is vLLM's name, and takes its JSON form "
                    "'{\"name\": NAME, \"path\": DIR}' as well");
}

void add_decode_lookahead_flag(CLI::App* app, bool& off) {
  app->add_flag("--no-decode-lookahead", off,
                "Decode step by step. By default each decode step is launched before the previous step's token "
                "is read back (the token passed on the device), so the host's work for a step overlaps the GPU's; "
                "the tokens and caches are the same either way");
}

void add_speculative_flag(CLI::App* app, std::string& json) {
  app->add_option("--speculative-config", json,
                  "Speculative decoding, as vLLM's flag: a JSON object such as '{\"method\": \"ngram\", "
                  "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}'. Each decode "
                  "pass of a request (an agent's step) also checks up to num_speculative_tokens drafts: the "
                  "tokens that followed the latest earlier occurrence of the text's last prompt_lookup_min..max tokens "
                  "(n-gram lookup over the prompt and output, an agent's whole trajectory; no draft model). The drafts "
                  "the model agrees with are kept, so one pass can give several tokens, the same ones as without; text "
                  "that copies from its context (an action quoting a tool's observation) gains most. Or suffix "
                  "decoding, '{\"method\": \"suffix\"}' (num_speculative_tokens, default 32, is then the most a pass "
                  "drafts): the likeliest continuation of the text's latest tokens over all their occurrences, in the "
                  "text and in the outputs of earlier finished requests (agents that write the same kinds of steps "
                  "again), as many drafts as the match supports; keys suffix_decoding_max_tree_depth (24), "
                  "suffix_decoding_max_cached_requests (10000; 0: the text only), suffix_decoding_max_spec_factor "
                  "(1.0, drafts per matched token) and suffix_decoding_min_token_prob (0.1). Optional "
                  "\"disable_by_batch_size\": B, no drafts in passes that decode more than B sequences. Sampled "
                  "requests speculate too: each row is picked with the random draw it would get one token a pass, "
                  "so a draft is kept with the probability the model gives it and a seed gives the same text; "
                  "penalties, logits processors, structured outputs and logprobs apply row by row");
}

Result<SpeculativeOptions> speculative_options(const std::string& json) {
  if (json.empty()) return SpeculativeOptions{};
  return parse_speculative_config(json);
}

void add_prefill_attention_flag(CLI::App* app, std::string& value) {
  app->add_option("--prefill-attention", value,
                  "With --device cuda: the prefill attention kernel, v6 (warp-specialised wgmma, the default) or v5 "
                  "(the previous wgmma kernel); decode and the K-side LoRA term pick their own. The environment "
                  "variable LRAGENT_CUDA_PREFILL_KERNEL, when set, wins")
      ->default_val("v6")
      ->check(CLI::IsMember({"v5", "v6"}));
}

namespace {

// Finite, above 0 (strict) or at least `min`, and at most `max` when max > min.
CLI::Validator number_check(bool strict, double min = 0, double max = 0, const char* unit = "") {
  return CLI::Validator(
      [strict, min, max, unit](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
          return "'" + text + "' is not a finite number";
        if (strict && !(v > 0)) return fmt::format("must be > 0, not {}", text);
        if (!strict && v < min) return fmt::format("must be >= {}, not {}", min, text);
        if (max > min && v > max) return fmt::format("must be at most {}{}, not {}", max, unit, text);
        return {};
      },
      // The label --help shows after the type: the range the check enforces.
      strict ? std::string("POSITIVE")
             : max > min ? fmt::format("in [{} - {}]{}", min, max, unit)
                         : (min == 0 ? std::string("NONNEGATIVE") : fmt::format(">= {}", min)));
}

}  // namespace

CLI::Validator non_negative() { return number_check(false); }
CLI::Validator positive() { return number_check(true); }
CLI::Validator in_range(double min, double max) { return number_check(false, min, max); }
// Converted to bytes as int64: past ~9.2e9 GB the conversion would overflow.
CLI::Validator memory_gb() { return number_check(false, 0, 1e6, " GB"); }

void add_threads_flag(CLI::App* app, int& threads) {
  app->add_option("--threads", threads, "CPU threads (0: all cores)")->default_val(0)->check(in_range(0, 1024));
}

int report(const Error& e) {
  fmt::print(stderr, "error: {}\n", e.message);
  switch (e.code) {
    case ErrorCode::kInvalidArgument: return 2;
    case ErrorCode::kNotFound: return 3;
    case ErrorCode::kCorrupt: return 4;
    case ErrorCode::kUnsupported: return 5;
    case ErrorCode::kOutOfMemory: return 6;
    default: return 1;
  }
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    char* end = nullptr;
    long v = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      return make_error(ErrorCode::kInvalidArgument, "--prompt-tokens: '{}' is not a token id (expected e.g. 1,2,3)",
                        item);
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  if (ids.empty()) return make_error(ErrorCode::kInvalidArgument, "--prompt-tokens is empty");
  return ids;
}

Result<std::unique_ptr<Backend>> make_backend(const ModelFlags& flags) {
  if (flags.device == "cpu") return make_cpu_backend(flags.threads);
  CudaBackendOptions o;
  o.dtype = flags.dtype == "f32" ? DType::kF32 : DType::kBF16;
  o.graphs = !flags.enforce_eager;
  o.prefill_attention = flags.prefill_attention == "v5" ? 5 : 6;
  if (flags.device.rfind("cuda", 0) == 0) {
    if (flags.device.size() > 5 && flags.device[4] == ':') {
      char* end = nullptr;
      const long d = std::strtol(flags.device.c_str() + 5, &end, 10);
      if (*end != '\0' || d < 0) return make_error(ErrorCode::kInvalidArgument, "--device '{}': expected cuda:N", flags.device);
      o.device = static_cast<int>(d);
    } else if (flags.device != "cuda") {
      return make_error(ErrorCode::kInvalidArgument, "--device '{}': expected cpu, cuda or cuda:N", flags.device);
    }
    return make_cuda_backend(o);
  }
  return make_error(ErrorCode::kInvalidArgument, "--device '{}': expected cpu, cuda or cuda:N", flags.device);
}

namespace {

// A bar on stderr while the weights go to the device (seconds for an 8B checkpoint), redrawn per
// percent; only on a terminal, so logs and pipes get the two plain lines around it.
LoadProgress weight_progress() {
  if (!::isatty(::fileno(stderr))) return {};
  return [last = -1](int64_t done, int64_t total) mutable {
    if (total <= 0) return;
    const int pct = static_cast<int>(100 * done / total);
    if (pct == last) return;
    last = pct;
    constexpr int kWidth = 30;
    const int fill = pct * kWidth / 100;
    fmt::print(stderr, "\r\033[Kweights [{}{}] {:3d}% {:.2f} / {:.2f} GB{}", std::string(static_cast<size_t>(fill), '#'),
               std::string(static_cast<size_t>(kWidth - fill), '.'), pct, static_cast<double>(done) / 1e9,
               static_cast<double>(total) / 1e9, done >= total ? "\n" : "");
  };
}

}  // namespace

Result<LoadedModel> load_model(const ModelFlags& flags) {
  LoadedModel out;
  LRA_ASSIGN_OR_RETURN(out.backend, make_backend(flags));
  const auto t0 = std::chrono::steady_clock::now();
  if (flags.model_dir.empty() && !flags.tokenizer_dir.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "--tokenizer {}: the built-in synthetic model has its own byte tokenizer; give --model too",
                      flags.tokenizer_dir);
  if (flags.model_dir.empty()) {
    fmt::print(stderr,
               "note: no --model given: using the built-in synthetic model (deterministic random weights; the "
               "generated text is meaningless). Pass --model DIR with a Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint "
               "for real output.\n");
    LRA_ASSIGN_OR_RETURN(out.model, make_synthetic_model(SyntheticSpec{}, *out.backend));
    out.tokenizer = make_byte_tokenizer();
    out.synthetic = true;
  } else {
    fmt::print(stderr, "loading model {}\n", flags.model_dir);
    LRA_ASSIGN_OR_RETURN(out.model, LlamaModel::load(flags.model_dir, *out.backend, weight_progress()));
    std::error_code ec;  // unreadable counts as absent: the model loaded, the tokenizer is optional
    if (std::filesystem::exists(std::filesystem::path(flags.tokenizer_source()) / "tokenizer.json", ec)) {
      LRA_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::load_dir(flags.tokenizer_source()));
    } else if (!flags.tokenizer_dir.empty()) {
      return make_error(ErrorCode::kNotFound, "--tokenizer {}: no tokenizer.json there", flags.tokenizer_dir);
    }
    // The model's embedding rows must cover every id the tokenizer hands out.
    if (out.tokenizer && !flags.tokenizer_dir.empty() && out.tokenizer->vocab_size() > out.model->config().vocab_size)
      return make_error(ErrorCode::kInvalidArgument,
                        "--tokenizer {}: its vocabulary has {} tokens, more than the model's {}: not this model's tokenizer",
                        flags.tokenizer_dir, out.tokenizer->vocab_size(), out.model->config().vocab_size);
    const auto& c = out.model->config();
    fmt::print(stderr, "loaded {}: {} layers, hidden {}, {} heads / {} kv heads in {:.0f} ms\n", c.architecture,
               c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  out.adapters = std::make_unique<AdapterRegistry>();
  for (const std::string& spec : flags.adapters) {
    std::string name, dir;
    if (!spec.empty() && spec.front() == '{') {  // vLLM's --lora-modules JSON form
      const nlohmann::json j = nlohmann::json::parse(spec, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("path") ||
          !j["path"].is_string() || j["name"].get<std::string>().empty())
        return make_error(ErrorCode::kInvalidArgument,
                          "--adapter '{}': expected NAME=DIR or {{\"name\": NAME, \"path\": DIR}}", spec);
      name = j["name"];
      dir = j["path"];
    } else {
      const size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
        return make_error(ErrorCode::kInvalidArgument, "--adapter '{}': expected NAME=DIR", spec);
      name = spec.substr(0, eq);
      dir = spec.substr(eq + 1);
    }
    LRA_ASSIGN_OR_RETURN(auto adapter, load_lora_adapter(name, dir, out.model->config()));
    LRA_RETURN_IF_ERROR(upload_adapter(*adapter, *out.backend));
    LRA_RETURN_IF_ERROR(out.adapters->add(std::move(adapter)));
  }
  if (!flags.adapters.empty()) fmt::print(stderr, "{}", out.adapters->describe_groups());
  return out;
}

}  // namespace lragent::cli
