#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/text_file.h"

namespace lragent {
namespace {

using json = nlohmann::json;

constexpr const char* kSupportedArchitectures = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

// Per-architecture defaults of the Hugging Face config classes for keys configs may omit.
struct ArchDefaults {
  const char* architecture;
  const char* model_type;
  int max_position_embeddings;
};
constexpr ArchDefaults kArchitectures[] = {
    {"LlamaForCausalLM", "llama", 2048},
    {"MistralForCausalLM", "mistral", 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 32768},
    {"Qwen3ForCausalLM", "qwen3", 32768},
};

std::string describe(const json& v) { return v.is_number_float() ? "a float" : std::string(v.type_name()); }

// Reads obj[key]; `required` keys may not be absent or null, optional ones keep *out then.
// `key` is the full dotted name used in messages (e.g. "rope_scaling.factor").
const json* lookup(const json& obj, const char* key) {
  const char* leaf = std::strrchr(key, '.');
  auto it = obj.find(leaf ? leaf + 1 : key);
  return (it == obj.end() || it->is_null()) ? nullptr : &*it;
}

Status read_int(const json& obj, const char* key, const std::string& source, bool required, int* out) {
  const json* v = lookup(obj, key);
  if (!v) {
    if (required) return make_error(ErrorCode::kCorrupt, "{}: missing required key '{}'", source, key);
    return Status::Ok();
  }
  if (!v->is_number_integer())
    return make_error(ErrorCode::kCorrupt, "{}: '{}' must be an integer, got {}", source, key, describe(*v));
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : v->get<int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    return make_error(ErrorCode::kCorrupt, "{}: '{}' value {} is out of range", source, key, v->dump());
  *out = static_cast<int>(x);
  return Status::Ok();
}

Status read_double(const json& obj, const char* key, const std::string& source, bool required, double* out) {
  const json* v = lookup(obj, key);
  if (!v) {
    if (required) return make_error(ErrorCode::kCorrupt, "{}: missing required key '{}'", source, key);
    return Status::Ok();
  }
  if (!v->is_number()) return make_error(ErrorCode::kCorrupt, "{}: '{}' must be a number, got {}", source, key, describe(*v));
  *out = v->get<double>();
  return Status::Ok();
}

Status read_bool(const json& obj, const char* key, const std::string& source, bool* out) {
  const json* v = lookup(obj, key);
  if (!v) return Status::Ok();
  if (!v->is_boolean()) return make_error(ErrorCode::kCorrupt, "{}: '{}' must be true or false, got {}", source, key, describe(*v));
  *out = v->get<bool>();
  return Status::Ok();
}

// The architecture from "architectures" (first supported entry), else from "model_type".
Result<const ArchDefaults*> resolve_architecture(const json& j, const std::string& source) {
  if (const json* archs = lookup(j, "architectures")) {
    if (!archs->is_array() || archs->empty())
      return make_error(ErrorCode::kCorrupt, "{}: 'architectures' must be a non-empty list of strings", source);
    for (const json& a : *archs) {
      if (!a.is_string())
        return make_error(ErrorCode::kCorrupt, "{}: 'architectures' must be a list of strings, got {} inside", source,
                          describe(a));
      for (const ArchDefaults& d : kArchitectures)
        if (a.get_ref<const std::string&>() == d.architecture) return &d;
    }
    return make_error(ErrorCode::kUnsupported, "{}: architecture '{}' is not supported; supported: {}", source,
                      (*archs)[0].get<std::string>(), kSupportedArchitectures);
  }
  if (const json* mt = lookup(j, "model_type")) {
    if (!mt->is_string())
      return make_error(ErrorCode::kCorrupt, "{}: 'model_type' must be a string, got {}", source, describe(*mt));
    for (const ArchDefaults& d : kArchitectures)
      if (mt->get_ref<const std::string&>() == d.model_type) return &d;
    return make_error(ErrorCode::kUnsupported, "{}: model_type '{}' is not supported; supported architectures: {}",
                      source, mt->get<std::string>(), kSupportedArchitectures);
  }
  return make_error(ErrorCode::kCorrupt, "{}: missing required key 'architectures'", source);
}

// RoPE scaling from `key`: "rope_scaling" (transformers v4) or "rope_parameters" (v5, which
// also holds rope_theta there and says "default" for no scaling).
Status parse_rope_scaling(const json& j, const char* key, const std::string& source, ModelConfig* cfg) {
  const json* rs = lookup(j, key);
  if (!rs) return Status::Ok();
  if (!rs->is_object())
    return make_error(ErrorCode::kCorrupt, "{}: '{}' must be null or an object, got {}", source, key, describe(*rs));
  const std::string k = key;
  auto sub = [&k](const char* leaf) { return k + "." + leaf; };
  LRA_RETURN_IF_ERROR(read_double(*rs, sub("rope_theta").c_str(), source, false, &cfg->rope_theta));
  // Newer configs spell it "rope_type", older ones "type".
  const json* type = lookup(*rs, "rope_type");
  if (!type) type = lookup(*rs, "type");
  if (!type || !type->is_string())
    return make_error(ErrorCode::kCorrupt, "{}: '{}' needs a string 'rope_type' (or 'type')", source, key);
  const std::string& t = type->get_ref<const std::string&>();
  RopeScaling& out = cfg->rope_scaling;
  if (t == "default") {
    out = RopeScaling{};
    return Status::Ok();
  }
  if (t != "llama3" && t != "linear")
    return make_error(ErrorCode::kUnsupported, "{}: {} type '{}' is not supported; supported: llama3, linear", source,
                      key, t);
  out.type = t;
  LRA_RETURN_IF_ERROR(read_double(*rs, sub("factor").c_str(), source, true, &out.factor));
  if (t == "llama3") {
    LRA_RETURN_IF_ERROR(read_double(*rs, sub("low_freq_factor").c_str(), source, true, &out.low_freq_factor));
    LRA_RETURN_IF_ERROR(read_double(*rs, sub("high_freq_factor").c_str(), source, true, &out.high_freq_factor));
    LRA_RETURN_IF_ERROR(read_int(*rs, sub("original_max_position_embeddings").c_str(), source, true,
                                 &out.original_max_position_embeddings));
  }
  return Status::Ok();
}

// Parts of an architecture this engine does not compute, refused rather than ignored.
Status check_unsupported(const json& j, const std::string& source, const ModelConfig& cfg) {
  if (cfg.mlp_bias)
    return make_error(ErrorCode::kUnsupported, "{}: mlp_bias is true; MLP biases are not supported", source);
  // ACT2FN["silu"] and ["swish"] are the same function; the MLP computes nothing else.
  if (const json* act = lookup(j, "hidden_act")) {
    if (!act->is_string())
      return make_error(ErrorCode::kCorrupt, "{}: 'hidden_act' must be a string, got {}", source, describe(*act));
    const std::string& a = act->get_ref<const std::string&>();
    if (a != "silu" && a != "swish")
      return make_error(ErrorCode::kUnsupported, "{}: hidden_act '{}' is not supported; supported: silu", source, a);
  }
  return Status::Ok();
}

Status parse_special_ids(const json& j, const std::string& source, ModelConfig* cfg) {
  LRA_RETURN_IF_ERROR(read_int(j, "bos_token_id", source, false, &cfg->bos_token_id));
  const json* eos = lookup(j, "eos_token_id");
  if (!eos) return Status::Ok();
  // eos_token_id is one id or a list (Llama 3 lists several end-of-turn tokens).
  if (eos->is_array()) {
    for (const json& e : *eos) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > std::numeric_limits<int>::max())
        return make_error(ErrorCode::kCorrupt, "{}: 'eos_token_id' list entries must be token ids, got {}", source,
                          describe(e));
      cfg->eos_token_ids.push_back(e.get<int>());
    }
    return Status::Ok();
  }
  int id = -1;
  LRA_RETURN_IF_ERROR(read_int(j, "eos_token_id", source, true, &id));
  cfg->eos_token_ids.push_back(id);
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  LRA_ASSIGN_OR_RETURN(json j, parse_json(json_text, source));
  if (!j.is_object()) return make_error(ErrorCode::kCorrupt, "{}: top level is not a JSON object", source);

  ModelConfig cfg;
  LRA_ASSIGN_OR_RETURN(const ArchDefaults* arch, resolve_architecture(j, source));
  cfg.architecture = arch->architecture;
  cfg.max_position_embeddings = arch->max_position_embeddings;

  LRA_RETURN_IF_ERROR(read_int(j, "vocab_size", source, true, &cfg.vocab_size));
  LRA_RETURN_IF_ERROR(read_int(j, "hidden_size", source, true, &cfg.hidden_size));
  LRA_RETURN_IF_ERROR(read_int(j, "intermediate_size", source, true, &cfg.intermediate_size));
  LRA_RETURN_IF_ERROR(read_int(j, "num_hidden_layers", source, true, &cfg.num_layers));
  LRA_RETURN_IF_ERROR(read_int(j, "num_attention_heads", source, true, &cfg.num_heads));
  cfg.num_kv_heads = cfg.num_heads;  // no key means plain multi-head attention
  LRA_RETURN_IF_ERROR(read_int(j, "num_key_value_heads", source, false, &cfg.num_kv_heads));
  LRA_RETURN_IF_ERROR(read_int(j, "head_dim", source, false, &cfg.head_dim));
  if (cfg.head_dim == 0 && cfg.num_heads > 0) {
    if (cfg.hidden_size % cfg.num_heads != 0)
      return make_error(ErrorCode::kCorrupt, "{}: hidden_size {} is not divisible by num_attention_heads {} and no head_dim is given",
                        source, cfg.hidden_size, cfg.num_heads);
    cfg.head_dim = cfg.hidden_size / cfg.num_heads;
  }
  LRA_RETURN_IF_ERROR(read_int(j, "max_position_embeddings", source, false, &cfg.max_position_embeddings));
  LRA_RETURN_IF_ERROR(read_double(j, "rms_norm_eps", source, false, &cfg.rms_norm_eps));
  LRA_RETURN_IF_ERROR(read_double(j, "rope_theta", source, false, &cfg.rope_theta));
  LRA_RETURN_IF_ERROR(parse_rope_scaling(j, "rope_scaling", source, &cfg));
  LRA_RETURN_IF_ERROR(parse_rope_scaling(j, "rope_parameters", source, &cfg));  // v5's spelling wins
  LRA_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", source, &cfg.tie_word_embeddings));
  if (cfg.architecture == "Qwen2ForCausalLM") {
    cfg.attention_bias = true;  // Qwen2 always has q/k/v biases; its config has no key for it
  } else if (cfg.architecture == "LlamaForCausalLM") {
    LRA_RETURN_IF_ERROR(read_bool(j, "attention_bias", source, &cfg.attention_bias));
    LRA_RETURN_IF_ERROR(read_bool(j, "mlp_bias", source, &cfg.mlp_bias));
  } else if (cfg.architecture == "Qwen3ForCausalLM") {
    // As Llama's: q/k/v and o_proj biases when true (HF's Qwen3Attention); no MLP biases.
    LRA_RETURN_IF_ERROR(read_bool(j, "attention_bias", source, &cfg.attention_bias));
    cfg.qk_norm = true;
  }
  LRA_RETURN_IF_ERROR(check_unsupported(j, source, cfg));
  // Linear scaling stretches positions by `factor`: configs give the original context (e.g.
  // 4096 for a 16k model), so the usable one is factor times it, as vLLM derives it. (llama3
  // configs give the scaled context already.)
  if (cfg.rope_scaling.type == "linear" && cfg.rope_scaling.factor > 1 && std::isfinite(cfg.rope_scaling.factor))
    cfg.max_position_embeddings = static_cast<int>(std::min<double>(
        std::numeric_limits<int>::max(), std::floor(cfg.max_position_embeddings * cfg.rope_scaling.factor)));
  // Sliding-window attention (Mistral; Qwen2/3 with use_sliding_window) equals full attention over
  // contexts no longer than the window: the context is capped there instead of attending wrongly.
  bool windowed = cfg.architecture == "MistralForCausalLM";
  if (cfg.architecture == "Qwen2ForCausalLM" || cfg.architecture == "Qwen3ForCausalLM")
    LRA_RETURN_IF_ERROR(read_bool(j, "use_sliding_window", source, &windowed));
  if (windowed) {
    LRA_RETURN_IF_ERROR(read_int(j, "sliding_window", source, false, &cfg.sliding_window));
    if (cfg.sliding_window < 0)
      return make_error(ErrorCode::kCorrupt, "{}: sliding_window must be positive, got {}", source, cfg.sliding_window);
    if (cfg.sliding_window > 0 && cfg.sliding_window < cfg.max_position_embeddings)
      cfg.max_position_embeddings = cfg.sliding_window;
    else
      cfg.sliding_window = 0;  // no narrower than the context: full attention
  }
  LRA_RETURN_IF_ERROR(parse_special_ids(j, source, &cfg));
  // Informational only; newer transformers write "dtype" instead of "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"})
    if (const json* v = lookup(j, key); v && v->is_string() && cfg.torch_dtype.empty()) cfg.torch_dtype = v->get<std::string>();

  LRA_RETURN_IF_ERROR(cfg.validate(source));
  return cfg;
}

Status ModelConfig::validate(const std::string& source) const {
  const std::pair<const char*, int> sizes[] = {
      {"vocab_size", vocab_size},           {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size}, {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},   {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},               {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& [key, value] : sizes)
    if (value <= 0) return make_error(ErrorCode::kCorrupt, "{}: {} must be positive, got {}", source, key, value);
  if (num_heads % num_kv_heads != 0)
    return make_error(ErrorCode::kCorrupt, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                      source, num_heads, num_kv_heads);
  if (head_dim % 2 != 0)
    return make_error(ErrorCode::kCorrupt, "{}: head_dim {} must be even for rotary embeddings", source, head_dim);
  if (!(rms_norm_eps > 0 && std::isfinite(rms_norm_eps)))
    return make_error(ErrorCode::kCorrupt, "{}: rms_norm_eps must be a positive number, got {}", source, rms_norm_eps);
  if (!(rope_theta > 0 && std::isfinite(rope_theta)))
    return make_error(ErrorCode::kCorrupt, "{}: rope_theta must be a positive number, got {}", source, rope_theta);
  if (!rope_scaling.type.empty()) {
    if (!(rope_scaling.factor > 0 && std::isfinite(rope_scaling.factor)))
      return make_error(ErrorCode::kCorrupt, "{}: rope_scaling.factor must be positive, got {}", source, rope_scaling.factor);
    // llama3 scaling divides by low_freq_factor and by (high - low).
    if (rope_scaling.type == "llama3" &&
        !(rope_scaling.low_freq_factor > 0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
          std::isfinite(rope_scaling.high_freq_factor) && rope_scaling.original_max_position_embeddings > 0))
      return make_error(ErrorCode::kCorrupt,
                        "{}: llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor and "
                        "original_max_position_embeddings > 0, got {}, {}, {}",
                        source, rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
                        rope_scaling.original_max_position_embeddings);
  }
  return Status::Ok();
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return make_error(ErrorCode::kNotFound, "no config.json in {} (is it a Hugging Face model directory?)", model_dir);
  LRA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  LRA_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(text, path));
  // generation_config.json's eos_token_id is what HF generate() and vLLM stop at (Llama 3
  // Instruct lists its end-of-turn id <|eot_id|> only there): its ids join config.json's.
  const std::string gen_path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (std::filesystem::exists(gen_path, ec)) {
    LRA_ASSIGN_OR_RETURN(std::string gen_text, read_text_file(gen_path));
    LRA_ASSIGN_OR_RETURN(json gen, parse_json(gen_text, gen_path));
    if (!gen.is_object()) return make_error(ErrorCode::kCorrupt, "{}: top level is not a JSON object", gen_path);
    ModelConfig ids;  // only its eos ids are used
    LRA_RETURN_IF_ERROR(parse_special_ids(gen, gen_path, &ids));
    for (int id : ids.eos_token_ids)
      if (std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), id) == cfg.eos_token_ids.end())
        cfg.eos_token_ids.push_back(id);
  }
  return cfg;
}

}  // namespace lragent
