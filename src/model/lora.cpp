#include "model/lora.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/text_file.h"
#include "model/safetensors.h"

namespace lragent {
namespace {

using ojson = nlohmann::ordered_json;  // keeps key order: the first matching rank_pattern key wins, as in PEFT

constexpr const char* kTargetNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};
constexpr const char* kTargetList = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
constexpr int kOtherModule = -1;      // a module of the model that is not an adaptable projection
constexpr int kEmbeddingModule = -2;  // embed_tokens / lm_head

const char* block_of(int t) { return t <= static_cast<int>(LoraTarget::kO) ? "self_attn" : "mlp"; }

std::string module_name(int layer, int t) {
  return fmt::format("model.layers.{}.{}.{}", layer, block_of(t), kTargetNames[t]);
}

// {out_features, in_features} of projection t.
std::pair<int64_t, int64_t> target_dims(const ModelConfig& c, int t) {
  const int64_t q = static_cast<int64_t>(c.num_heads) * c.head_dim, kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  switch (static_cast<LoraTarget>(t)) {
    case LoraTarget::kQ: return {q, c.hidden_size};
    case LoraTarget::kK: case LoraTarget::kV: return {kv, c.hidden_size};
    case LoraTarget::kO: return {c.hidden_size, q};
    case LoraTarget::kGate: case LoraTarget::kUp: return {c.intermediate_size, c.hidden_size};
    case LoraTarget::kDown: return {c.hidden_size, c.intermediate_size};
  }
  return {0, 0};
}

// Every module name of a Hugging Face Llama-family model (as named_modules() lists them),
// tagged with its target index, kOtherModule or kEmbeddingModule.
std::vector<std::pair<std::string, int>> model_modules(const ModelConfig& cfg) {
  std::vector<std::pair<std::string, int>> out = {{"model", kOtherModule},        {"model.embed_tokens", kEmbeddingModule},
                                                  {"model.layers", kOtherModule}, {"model.norm", kOtherModule},
                                                  {"model.rotary_emb", kOtherModule}, {"lm_head", kEmbeddingModule}};
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l);
    for (const char* sub : {"", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm", ".post_attention_layernorm",
                            ".self_attn.rotary_emb"})
      out.emplace_back(p + sub, kOtherModule);
    for (int t = 0; t < kNumLoraTargets; ++t) out.emplace_back(module_name(l, t), t);
  }
  return out;
}

// A PCRE2 regex matched against whole module names.
class FullMatcher {
 public:
  // `anchored` is the pattern wrapped so that a match must span the whole subject.
  static Result<FullMatcher> compile(const std::string& pattern, const std::string& anchored, const std::string& source) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(anchored.data()), anchored.size(), PCRE2_ANCHORED,
                                     &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];  // [256] NUL-terminated PCRE2 message
      pcre2_get_error_message(err, msg, sizeof(msg));
      return make_error(ErrorCode::kCorrupt, "{}: invalid regex '{}': {}", source, pattern, reinterpret_cast<char*>(msg));
    }
    FullMatcher m;
    m.code_.reset(code);
    m.pattern_ = pattern;
    return m;
  }
  Result<bool> matches(const std::string& subject, const std::string& source) const {
    std::unique_ptr<pcre2_match_data, MatchDataFree> md(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    if (!md) return make_error(ErrorCode::kOutOfMemory, "{}: out of memory matching regex '{}'", source, pattern_);
    const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0,
                               md.get(), nullptr);
    if (rc >= 0) return true;
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    return make_error(ErrorCode::kUnsupported, "{}: regex '{}' failed on '{}' (PCRE2 error {}; too complex?)", source,
                      pattern_, subject, rc);
  }

 private:
  struct CodeFree { void operator()(pcre2_code* c) const { pcre2_code_free(c); } };
  struct MatchDataFree { void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); } };
  std::unique_ptr<pcre2_code, CodeFree> code_;
  std::string pattern_;
};

// target_modules: a list (exact name or ".suffix" match), a regex (full match), or "all-linear".
struct TargetSpec {
  bool all_linear = false;
  std::vector<std::string> names;
  std::optional<FullMatcher> regex;
};

// Per-module overrides: the first key K with re.match(r"(.*\.)?(K)$", module) wins (PEFT semantics).
template <typename V>
struct Pattern {
  FullMatcher key;
  V value;
};

struct AdapterSettings {
  int r = 0;
  double alpha = 0;
  bool use_rslora = false;
  TargetSpec targets;
  std::vector<Pattern<int>> rank_pattern;
  std::vector<Pattern<double>> alpha_pattern;
};

// True when an optional feature key is off: absent, null, false or empty.
bool is_unset(const ojson& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
         ((it->is_array() || it->is_object() || it->is_string()) && it->empty());
}

Status check_refusals(const ojson& j, const std::string& src) {
  auto peft = j.find("peft_type");
  if (peft == j.end() || !peft->is_string())
    return make_error(ErrorCode::kCorrupt, "{}: missing string 'peft_type' (is this a PEFT adapter?)", src);
  if (*peft != "LORA")
    return make_error(ErrorCode::kUnsupported, "{}: peft_type '{}' is not supported; only LORA adapters are",
                      src, peft->get<std::string>());
  if (!is_unset(j, "use_dora"))
    return make_error(ErrorCode::kUnsupported, "{}: use_dora is set: DoRA adapters are not supported", src);
  if (auto b = j.find("bias"); b != j.end() && !b->is_null() && *b != "none")
    return make_error(ErrorCode::kUnsupported, "{}: bias '{}' is not supported; only bias \"none\" is", src,
                      b->is_string() ? b->get<std::string>() : b->dump());
  const std::pair<const char*, const char*> refused[] = {
      {"modules_to_save", "fully trained extra modules (modules_to_save) are not supported"},
      {"layers_to_transform", "layers_to_transform is not supported (select layers with a target_modules regex instead)"},
      {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style transposed weights) is not supported"},
      {"lora_bias", "lora_bias (a bias on lora_B) is not supported"},
      {"layer_replication", "layer_replication is not supported"},
      {"exclude_modules", "exclude_modules is not supported"},
      {"trainable_token_indices", "trainable_token_indices (embedding updates) is not supported"},
      {"alora_invocation_tokens",
       "alora_invocation_tokens is set: activated LoRA (applied only from its invocation tokens on) is not supported"},
      {"target_parameters", "target_parameters (LoRA on raw parameters, e.g. MoE experts) is not supported"},
  };
  for (const auto& [key, why] : refused)
    if (!is_unset(j, key)) return make_error(ErrorCode::kUnsupported, "{}: {}", src, why);
  return Status::Ok();
}

Result<bool> selects(const TargetSpec& spec, const std::string& module, const std::string& src) {
  if (spec.regex) return spec.regex->matches(module, src);
  for (const std::string& e : spec.names)
    if (module == e || (module.size() > e.size() && module.ends_with(e) && module[module.size() - e.size() - 1] == '.'))
      return true;
  return false;
}

// Errors for selections the forward pass cannot apply; `what` names the list entry or regex.
Status check_selection(const TargetSpec& spec, const std::string& what, const std::vector<std::pair<std::string, int>>& modules,
                       const std::string& src) {
  bool any_projection = false;
  for (const auto& [module, kind] : modules) {
    LRA_ASSIGN_OR_RETURN(bool hit, selects(spec, module, src));
    if (!hit) continue;
    if (kind == kEmbeddingModule)
      return make_error(ErrorCode::kUnsupported, "{}: target_modules {} selects {}: embedding/lm_head adapters are not supported",
                        src, what, module);
    if (kind == kOtherModule)
      return make_error(ErrorCode::kUnsupported, "{}: target_modules {} selects {}, which is not one of {}", src, what,
                        module, kTargetList);
    any_projection = true;
  }
  if (!any_projection)
    return make_error(ErrorCode::kUnsupported, "{}: target_modules {} matches no module of this model (supported: {})",
                      src, what, kTargetList);
  return Status::Ok();
}

Result<TargetSpec> parse_targets(const ojson& j, const ModelConfig& cfg, const std::string& src) {
  auto tm = j.find("target_modules");
  TargetSpec spec;
  const auto modules = model_modules(cfg);
  if (tm != j.end() && tm->is_string()) {
    const std::string pattern = tm->get<std::string>();
    if (pattern == "all-linear") {  // PEFT shorthand: every linear layer but the output head
      spec.all_linear = true;
      return spec;
    }
    LRA_ASSIGN_OR_RETURN(FullMatcher m, FullMatcher::compile(pattern, "(?:" + pattern + ")\\z", src));
    spec.regex = std::move(m);
    LRA_RETURN_IF_ERROR(check_selection(spec, fmt::format("regex '{}'", pattern), modules, src));
    return spec;
  }
  if (tm == j.end() || !tm->is_array() || tm->empty())
    return make_error(ErrorCode::kCorrupt, "{}: 'target_modules' must be a non-empty list of module names or a regex string", src);
  for (const ojson& e : *tm) {
    if (!e.is_string() || e.get_ref<const std::string&>().empty())
      return make_error(ErrorCode::kCorrupt, "{}: 'target_modules' entries must be non-empty strings", src);
    TargetSpec one;
    one.names = {e.get<std::string>()};
    LRA_RETURN_IF_ERROR(check_selection(one, fmt::format("entry '{}'", one.names[0]), modules, src));
    spec.names.push_back(one.names[0]);
  }
  return spec;
}

template <typename V>
Result<std::vector<Pattern<V>>> parse_patterns(const ojson& j, const char* key, const std::string& src) {
  std::vector<Pattern<V>> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_object()) return make_error(ErrorCode::kCorrupt, "{}: '{}' must be an object", src, key);
  for (const auto& [k, v] : it->items()) {
    const bool ok = std::is_same_v<V, int> ? (v.is_number_integer() && v.template get<int64_t>() > 0 &&
                                              v.template get<int64_t>() <= (1 << 20))
                                           : (v.is_number() && std::isfinite(v.template get<double>()));
    if (!ok)
      return make_error(ErrorCode::kCorrupt, "{}: {} value for '{}' must be a {}", src, key, k,
                        std::is_same_v<V, int> ? "positive integer rank" : "number");
    LRA_ASSIGN_OR_RETURN(FullMatcher m, FullMatcher::compile(k, "(?:.*\\.)?(?:" + k + ")\\z", src));
    out.push_back({std::move(m), v.template get<V>()});
  }
  return out;
}

template <typename V>
Result<V> pattern_value(const std::vector<Pattern<V>>& patterns, const std::string& module, V fallback, const std::string& src) {
  for (const Pattern<V>& p : patterns) {
    LRA_ASSIGN_OR_RETURN(bool hit, p.key.matches(module, src));
    if (hit) return p.value;
  }
  return fallback;
}

Result<AdapterSettings> parse_adapter_config(const ojson& j, const ModelConfig& cfg, const std::string& src) {
  if (!j.is_object()) return make_error(ErrorCode::kCorrupt, "{}: top level is not a JSON object", src);
  LRA_RETURN_IF_ERROR(check_refusals(j, src));
  AdapterSettings s;
  auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<int64_t>() <= 0 || r->get<int64_t>() > (1 << 20))
    return make_error(ErrorCode::kCorrupt, "{}: 'r' must be a positive integer rank", src);
  s.r = r->get<int>();
  auto alpha = j.find("lora_alpha");
  if (alpha == j.end() || !alpha->is_number() || !std::isfinite(alpha->get<double>()))
    return make_error(ErrorCode::kCorrupt, "{}: 'lora_alpha' must be a number", src);
  s.alpha = alpha->get<double>();
  if (auto rs = j.find("use_rslora"); rs != j.end() && !rs->is_null()) {
    if (!rs->is_boolean()) return make_error(ErrorCode::kCorrupt, "{}: 'use_rslora' must be true or false", src);
    s.use_rslora = rs->get<bool>();
  }
  LRA_ASSIGN_OR_RETURN(s.targets, parse_targets(j, cfg, src));
  LRA_ASSIGN_OR_RETURN(s.rank_pattern, parse_patterns<int>(j, "rank_pattern", src));
  LRA_ASSIGN_OR_RETURN(s.alpha_pattern, parse_patterns<double>(j, "alpha_pattern", src));
  return s;
}

// "base_model.model.model.layers.3.self_attn.q_proj.lora_A[.default].weight" -> (3, kQ, A).
struct TensorSlot {
  int layer = 0;
  int target = 0;
  bool is_b = false;
};
std::optional<TensorSlot> parse_tensor_name(std::string_view name) {
  constexpr std::string_view kPrefix = "base_model.model.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  std::vector<std::string_view> tok;
  for (size_t p = 0;;) {
    const size_t q = name.find('.', p);
    tok.push_back(name.substr(p, q == std::string_view::npos ? q : q - p));
    if (q == std::string_view::npos) break;
    p = q + 1;
  }
  // model . layers . L . block . proj . lora_X [. adapter_name] . weight
  if ((tok.size() != 7 && tok.size() != 8) || tok[0] != "model" || tok[1] != "layers" || tok.back() != "weight")
    return std::nullopt;
  TensorSlot slot;
  // Digits only: from_chars takes a leading '-', and a layer of -1 would index before the tables.
  if (tok[2].empty() || !std::all_of(tok[2].begin(), tok[2].end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  auto [end, ec] = std::from_chars(tok[2].data(), tok[2].data() + tok[2].size(), slot.layer);
  if (ec != std::errc() || end != tok[2].data() + tok[2].size()) return std::nullopt;
  if (tok[5] != "lora_A" && tok[5] != "lora_B") return std::nullopt;
  slot.is_b = tok[5] == "lora_B";
  for (slot.target = 0; slot.target < kNumLoraTargets; ++slot.target)
    if (tok[4] == kTargetNames[slot.target] && tok[3] == block_of(slot.target)) return slot;
  return std::nullopt;
}

uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF64; }

// Checks A [r, in] and B [out, r] of one module and converts them to an f32 LoraModule.
Result<LoraModule> make_module(const TensorView& a, const TensorView& b, int expected_rank, double alpha, bool rslora,
                               std::pair<int64_t, int64_t> out_in, const std::string& module, const std::string& src) {
  for (const TensorView* v : {&a, &b})
    if (v->rank() != 2 || !is_float(v->dtype))
      return make_error(ErrorCode::kCorrupt, "{}: lora_{} of {} must be a 2-D float tensor, got {} {}", src,
                        v == &a ? 'A' : 'B', module, dtype_name(v->dtype), v->shape_str());
  const auto [out, in] = out_in;
  if (a.dim(0) != b.dim(1))
    return make_error(ErrorCode::kCorrupt, "{}: {} has lora_A {} (rank {}) but lora_B {} (rank {})", src, module,
                      a.shape_str(), a.dim(0), b.shape_str(), b.dim(1));
  if (a.dim(0) != expected_rank)
    return make_error(ErrorCode::kCorrupt, "{}: {} has rank {} but adapter_config.json gives r = {} for it", src, module,
                      a.dim(0), expected_rank);
  if (a.dim(1) != in || b.dim(0) != out)
    return make_error(ErrorCode::kCorrupt,
                      "{}: {} has lora_A {} and lora_B {}, expected [{}, {}] and [{}, {}] for this model "
                      "(in_features {}, out_features {})",
                      src, module, a.shape_str(), b.shape_str(), expected_rank, in, out, expected_rank, in, out);
  LoraModule m;
  m.rank = expected_rank;
  m.scale = static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(expected_rank)) : alpha / expected_rank);
  m.a_hash = fnv1a(a.data, a.nbytes());
  m.a = Tensor::empty(DType::kF32, a.shape);  // [r, in]
  m.b = Tensor::empty(DType::kF32, b.shape);  // [out, r]
  convert_to_f32(a.dtype, a.data, m.a.f32(), static_cast<size_t>(a.numel()));
  convert_to_f32(b.dtype, b.data, m.b.f32(), static_cast<size_t>(b.numel()));
  return m;
}

Result<ojson> parse_ordered_json(const std::string& text, const std::string& src) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    std::string_view what = e.what();
    if (auto p = what.find("] "); p != std::string_view::npos) what.remove_prefix(p + 2);
    return make_error(ErrorCode::kCorrupt, "{}: invalid JSON ({})", src, what);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kOutOfMemory, "{}: out of memory while parsing JSON", src);
  }
}

}  // namespace

const char* lora_target_name(LoraTarget t) { return kTargetNames[static_cast<int>(t)]; }

int LoraAdapter::max_rank() const {
  int rank = 0;
  for (const auto& layer : layers)
    for (const auto& m : layer)
      if (m) rank = std::max(rank, m->rank);
  return rank;
}

bool LoraAdapter::targets(LoraTarget t) const {
  return std::any_of(layers.begin(), layers.end(), [t](const auto& l) { return l[static_cast<size_t>(t)].has_value(); });
}

Result<std::unique_ptr<LoraAdapter>> load_lora_adapter(const std::string& name, const std::string& dir,
                                                       const ModelConfig& cfg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(ErrorCode::kNotFound, "adapter '{}': directory {} does not exist", name, dir);
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(cfg_path, ec))
    return make_error(ErrorCode::kNotFound, "adapter '{}': no adapter_config.json in {} (is it a PEFT adapter directory?)",
                      name, dir);
  LRA_ASSIGN_OR_RETURN(std::string text, read_text_file(cfg_path));
  if (!fs::exists(st_path, ec)) {
    // The config's own errors first: they say more than a missing weights file.
    LRA_ASSIGN_OR_RETURN(ojson j, parse_ordered_json(text, cfg_path));
    if (auto settings = parse_adapter_config(j, cfg, cfg_path); !settings.ok()) return settings.error();
    if (fs::exists(fs::path(dir) / "adapter_model.bin", ec))
      return make_error(ErrorCode::kUnsupported, "adapter '{}': {} has only adapter_model.bin; re-save it as safetensors",
                        name, dir);
    return make_error(ErrorCode::kNotFound, "adapter '{}': no adapter_model.safetensors in {}", name, dir);
  }
  LRA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(st_path));
  LRA_ASSIGN_OR_RETURN(auto adapter, parse_lora_adapter(name, text, cfg_path, *file, st_path, cfg));
  adapter->dir = dir;
  return adapter;
}

Result<std::unique_ptr<LoraAdapter>> parse_lora_adapter(const std::string& name, const std::string& config_json,
                                                        const std::string& cfg_path, const SafetensorsFile& file,
                                                        const std::string& st_path, const ModelConfig& cfg) {
  LRA_ASSIGN_OR_RETURN(ojson j, parse_ordered_json(config_json, cfg_path));
  LRA_ASSIGN_OR_RETURN(AdapterSettings s, parse_adapter_config(j, cfg, cfg_path));

  // Which (layer, target) the config selects: [num_layers][target].
  std::vector<std::array<bool, kNumLoraTargets>> selected(static_cast<size_t>(cfg.num_layers));
  for (int l = 0; l < cfg.num_layers; ++l)
    for (int t = 0; t < kNumLoraTargets; ++t) {
      bool hit = s.targets.all_linear;
      if (!hit) {
        LRA_ASSIGN_OR_RETURN(hit, selects(s.targets, module_name(l, t), cfg_path));
      }
      selected[static_cast<size_t>(l)][static_cast<size_t>(t)] = hit;
    }

  // Place every tensor of the file in found [num_layers][target][A, B]; anything that is not
  // an A/B of a selected module is an error.
  std::vector<std::array<std::array<const TensorInfo*, 2>, kNumLoraTargets>> found(static_cast<size_t>(cfg.num_layers));
  for (const TensorInfo& info : file.tensors()) {
    const auto slot = parse_tensor_name(info.name);
    if (!slot)
      return make_error(ErrorCode::kCorrupt,
                        "{}: unexpected tensor '{}' (expected base_model.model.<module>.lora_A.weight / lora_B.weight "
                        "of a {} module)", st_path, info.name, kTargetList);
    if (slot->layer < 0 || slot->layer >= cfg.num_layers)
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' is for layer {} but the model has {} layers", st_path,
                        info.name, slot->layer, cfg.num_layers);
    if (!selected[static_cast<size_t>(slot->layer)][static_cast<size_t>(slot->target)])
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' is for {}, which target_modules in {} does not select",
                        st_path, info.name, module_name(slot->layer, slot->target), cfg_path);
    const TensorInfo*& dst = found[static_cast<size_t>(slot->layer)][static_cast<size_t>(slot->target)][slot->is_b];
    if (dst)
      return make_error(ErrorCode::kCorrupt, "{}: tensors '{}' and '{}' are both lora_{} of {}", st_path, dst->name,
                        info.name, slot->is_b ? 'B' : 'A', module_name(slot->layer, slot->target));
    dst = &info;
  }

  auto adapter = std::make_unique<LoraAdapter>();
  adapter->name = name;
  adapter->default_rank = s.r;
  adapter->lora_alpha = static_cast<float>(s.alpha);
  adapter->use_rslora = s.use_rslora;
  adapter->layers.resize(static_cast<size_t>(cfg.num_layers));
  int adapted = 0;
  for (int l = 0; l < cfg.num_layers; ++l)
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (!selected[static_cast<size_t>(l)][static_cast<size_t>(t)]) continue;
      const std::string module = module_name(l, t);
      const auto& ab = found[static_cast<size_t>(l)][static_cast<size_t>(t)];
      for (int which = 0; which < 2; ++which)
        if (!ab[static_cast<size_t>(which)])
          return make_error(ErrorCode::kCorrupt, "{}: missing lora_{} tensor for {} (expected base_model.model.{}.lora_{}.weight)",
                            st_path, which ? 'B' : 'A', module, module, which ? 'B' : 'A');
      LRA_ASSIGN_OR_RETURN(int rank, pattern_value(s.rank_pattern, module, s.r, cfg_path));
      LRA_ASSIGN_OR_RETURN(double alpha, pattern_value(s.alpha_pattern, module, s.alpha, cfg_path));
      LRA_ASSIGN_OR_RETURN(LoraModule m, make_module(file.view(*ab[0]), file.view(*ab[1]), rank, alpha, s.use_rslora,
                                                     target_dims(cfg, t), module, st_path));
      adapter->layers[static_cast<size_t>(l)][static_cast<size_t>(t)] = std::move(m);
      ++adapted;
    }
  if (adapted == 0)
    return make_error(ErrorCode::kCorrupt, "adapter '{}': {} adapts no module of this model", name, st_path);
  return adapter;
}

// ---- registry ---------------------------------------------------------------------------------

Status AdapterRegistry::add(std::unique_ptr<LoraAdapter> adapter) {
  if (!adapter) return make_error(ErrorCode::kInvalidArgument, "AdapterRegistry::add: null adapter");
  if (adapter->name.empty())
    return make_error(ErrorCode::kInvalidArgument, "adapter from {} has an empty name", adapter->dir);
  if (find(adapter->name))
    return make_error(ErrorCode::kInvalidArgument, "adapter name '{}' ({}) is already registered (from {})",
                      adapter->name, adapter->dir, find(adapter->name)->dir);
  if (!adapters_.empty() && adapter->layers.size() != adapters_[0]->layers.size())
    return make_error(ErrorCode::kInvalidArgument, "adapter '{}' ({}) has {} layers but the registered adapters have {}",
                      adapter->name, adapter->dir, adapter->layers.size(), adapters_[0]->layers.size());
  adapters_.push_back(std::move(adapter));
  rebuild_groups();
  return Status::Ok();
}

namespace {
// Bit-identical A: the hash (of the file bytes) narrows, a compare of the f32 matrices confirms.
bool a_bits_equal(const LoraModule& x, const LoraModule& y) {
  return x.a_hash == y.a_hash && x.a.shape() == y.a.shape() &&
         std::memcmp(x.a.view().data, y.a.view().data, x.a.view().nbytes()) == 0;
}
}  // namespace

bool LoraModule::same_a_as(const LoraModule& o) const {
  // A registry found them equal: no compare of A (a batched decode step asks this for every
  // layer, target and pair of adapters in the batch: 256 KB compared each time at 8B, r = 16).
  if (this == &o || (a_lead && a_lead == o.a_lead)) return true;
  return a_bits_equal(*this, o);  // different hashes never compare; equal ones (another registry, or none) do
}

const LoraAdapter* AdapterRegistry::find(const std::string& name) const {
  for (const auto& a : adapters_)
    if (a->name == name) return a.get();
  return nullptr;
}

std::unique_ptr<LoraAdapter> AdapterRegistry::remove(const std::string& name) {
  const auto it = std::find_if(adapters_.begin(), adapters_.end(), [&](const auto& a) { return a->name == name; });
  if (it == adapters_.end()) return nullptr;
  std::unique_ptr<LoraAdapter> out = std::move(*it);
  adapters_.erase(it);
  for (auto& layer : out->layers)
    for (auto& m : layer)
      if (m) m->a_lead = &*m;
  rebuild_groups();
  return out;
}

void AdapterRegistry::rebuild_groups() {
  groups_.clear();
  const size_t n_layers = adapters_.empty() ? 0 : adapters_[0]->layers.size();
  for (size_t l = 0; l < n_layers; ++l)
    for (size_t t = 0; t < kNumLoraTargets; ++t) {
      // Equivalence classes of bit-identical A: the hash (of the file bytes) narrows the
      // candidates, a full compare of the f32 matrices confirms.
      std::vector<std::vector<int>> classes;
      for (size_t i = 0; i < adapters_.size(); ++i) {
        const auto& m = adapters_[i]->layers[l][t];
        if (!m) continue;
        auto same = [&](const std::vector<int>& c) {
          return a_bits_equal(*adapters_[static_cast<size_t>(c[0])]->layers[l][t], *m);
        };
        auto it = std::find_if(classes.begin(), classes.end(), same);
        if (it == classes.end()) classes.push_back({static_cast<int>(i)});
        else it->push_back(static_cast<int>(i));
      }
      for (auto& c : classes) {
        const LoraModule* lead = &*adapters_[static_cast<size_t>(c[0])]->layers[l][t];
        for (int i : c) adapters_[static_cast<size_t>(i)]->layers[l][t]->a_lead = lead;
        if (c.size() >= 2) groups_.push_back({static_cast<int>(l), static_cast<LoraTarget>(t), std::move(c)});
      }
    }
}

std::string AdapterRegistry::describe_groups() const {
  if (groups_.empty()) return adapters_.size() < 2 ? "" : "lora_A: no two adapters share one in any layer\n";
  const size_t n_layers = adapters_[0]->layers.size();
  std::string out;
  for (int t = 0; t < kNumLoraTargets; ++t) {
    // member set -> layers where exactly that set shares A, in first-seen order
    std::vector<std::pair<std::vector<int>, std::vector<int>>> sets;
    for (const ShareGroup& g : groups_) {
      if (static_cast<int>(g.target) != t) continue;
      auto it = std::find_if(sets.begin(), sets.end(), [&](const auto& s) { return s.first == g.members; });
      if (it == sets.end()) sets.push_back({g.members, {g.layer}});
      else it->second.push_back(g.layer);
    }
    for (const auto& [members, layers] : sets) {
      std::vector<std::string> names;
      for (int i : members) names.push_back(adapters_[static_cast<size_t>(i)]->name);
      const std::string where = layers.size() == n_layers
                                    ? fmt::format("all {} layers", n_layers)
                                    : fmt::format("layers {} of {}", fmt::join(layers, ", "), n_layers);
      out += fmt::format("{}: {{{}}} share A in {}\n", kTargetNames[t], fmt::join(names, ", "), where);
    }
  }
  return out;
}

Status upload_adapter(LoraAdapter& adapter, Backend& backend) {
  if (backend.device() == Device::kCpu) return Status::Ok();
  for (auto& layer : adapter.layers)
    for (auto& m : layer) {
      if (!m) continue;
      m->a_dev = backend.upload(m->a.view(), backend.weight_dtype());
      m->b_dev = backend.upload(m->b.view(), backend.weight_dtype());
      if (!m->a_dev.view().data || !m->b_dev.view().data) {
        (void)backend.take_error();
        return make_error(ErrorCode::kOutOfMemory, "adapter '{}': no {} memory left for its LoRA weights",
                          adapter.name, backend.name());
      }
    }
  return backend.take_error();
}

}  // namespace lragent
