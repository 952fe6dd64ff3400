// Loading: tokenizer.json (+ tokenizer_config.json) -> HfTokenizer; and StreamDecoder.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/text_file.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/json_util.h"

namespace lragent {

namespace {

using tokjson::json;

Result<std::unique_ptr<BpeModel>> parse_model(const json& root, std::string_view source) {
  const json* model = tokjson::find(root, "model");
  const std::string where = tokjson::member(source, "model");
  if (model == nullptr) return tokjson::corrupt(source, "missing \"model\"");
  LRA_RETURN_IF_ERROR(tokjson::expect_object(*model, where));
  LRA_ASSIGN_OR_RETURN(const auto type, tokjson::get_optional_string(*model, "type", where));
  // Old files omit the type; HF then recognises BPE by its merges.
  const bool is_bpe = type ? *type == "BPE" : tokjson::find(*model, "merges") != nullptr;
  if (!is_bpe) {
    return tokjson::unsupported(where,
                                fmt::format("model type \"{}\" is not supported (only BPE)", type.value_or("?")));
  }
  return BpeModel::from_json(*model, where);
}

// added_tokens: HF keeps the vocab's id for a content the model already has.
Result<std::vector<AddedToken>> parse_added_tokens(const json& root, const BpeModel& model, std::string_view source) {
  std::vector<AddedToken> tokens;
  const json* list = tokjson::find(root, "added_tokens");
  if (list == nullptr) return tokens;
  const std::string where = tokjson::member(source, "added_tokens");
  if (!list->is_array()) return tokjson::corrupt(where, "expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& j = (*list)[i];
    const std::string w = tokjson::element(where, i);
    LRA_RETURN_IF_ERROR(tokjson::expect_object(j, w));
    AddedToken t;
    const json* id = tokjson::find(j, "id");
    if (id == nullptr) return tokjson::corrupt(tokjson::member(w, "id"), "missing");
    LRA_ASSIGN_OR_RETURN(t.id, tokjson::to_id(*id, tokjson::member(w, "id")));
    LRA_ASSIGN_OR_RETURN(t.content, tokjson::get_string(j, "content", w));
    LRA_ASSIGN_OR_RETURN(t.special, tokjson::get_bool(j, "special", w, false));
    LRA_ASSIGN_OR_RETURN(t.single_word, tokjson::get_bool(j, "single_word", w, false));
    LRA_ASSIGN_OR_RETURN(t.lstrip, tokjson::get_bool(j, "lstrip", w, false));
    LRA_ASSIGN_OR_RETURN(t.rstrip, tokjson::get_bool(j, "rstrip", w, false));
    LRA_ASSIGN_OR_RETURN(t.normalized, tokjson::get_bool(j, "normalized", w, !t.special));
    if (const int32_t vocab_id = model.token_to_id(t.content); vocab_id >= 0) t.id = vocab_id;
    tokens.push_back(std::move(t));
  }
  return tokens;
}

// The parts of tokenizer_config.json that change ids.
struct TokenizerConfig {
  std::optional<std::string> tokenizer_class;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::optional<bool> add_prefix_space;
  std::optional<bool> legacy;
};

// bos_token / eos_token: a string or an AddedToken object {"content": ...}.
Result<std::optional<std::string>> config_token(const json& cfg, std::string_view key, std::string_view where) {
  const json* v = tokjson::find(cfg, key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_object()) {
    LRA_ASSIGN_OR_RETURN(std::string content, tokjson::get_string(*v, "content", tokjson::member(where, key)));
    return std::optional<std::string>(std::move(content));
  }
  return tokjson::get_optional_string(cfg, key, where);
}

Result<std::optional<bool>> config_flag(const json& cfg, std::string_view key, std::string_view where) {
  if (tokjson::find(cfg, key) == nullptr) return std::optional<bool>();
  LRA_ASSIGN_OR_RETURN(const bool v, tokjson::get_bool(cfg, key, where, false));
  return std::optional<bool>(v);
}

Result<TokenizerConfig> parse_config(std::string_view text, std::string_view where) {
  TokenizerConfig c;
  if (text.empty()) return c;
  LRA_ASSIGN_OR_RETURN(const json cfg, parse_json(text, std::string(where)));
  LRA_RETURN_IF_ERROR(tokjson::expect_object(cfg, where));
  LRA_ASSIGN_OR_RETURN(c.bos_token, config_token(cfg, "bos_token", where));
  LRA_ASSIGN_OR_RETURN(c.eos_token, config_token(cfg, "eos_token", where));
  LRA_ASSIGN_OR_RETURN(c.add_bos_token, config_flag(cfg, "add_bos_token", where));
  LRA_ASSIGN_OR_RETURN(c.add_eos_token, config_flag(cfg, "add_eos_token", where));
  LRA_ASSIGN_OR_RETURN(c.add_prefix_space, config_flag(cfg, "add_prefix_space", where));
  LRA_ASSIGN_OR_RETURN(c.legacy, config_flag(cfg, "legacy", where));
  LRA_ASSIGN_OR_RETURN(c.tokenizer_class, tokjson::get_optional_string(cfg, "tokenizer_class", where));
  return c;
}

// transformers 5's LlamaTokenizer keeps only the vocab, merges and added tokens of
// tokenizer.json and builds the rest itself (tokenization_llama.py): no normalizer; Metaspace
// with prepend_scheme from add_prefix_space (default true) and legacy (default false), no
// split; BPE with fuse_unk and byte_fallback but no unk token, so characters with neither a
// piece nor byte pieces vanish; SentencePiece decoding, stripping one space when prefixing.
void rebuild_like_transformers_llama(json& root, const TokenizerConfig& cfg) {
  const bool prefix = cfg.add_prefix_space.value_or(true);
  const char* scheme = !prefix ? "never" : cfg.legacy.value_or(false) ? "always" : "first";
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", false}};
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  root["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
  if (json* model = root.contains("model") ? &root["model"] : nullptr; model != nullptr && model->is_object()) {
    (*model)["unk_token"] = nullptr;
    (*model)["fuse_unk"] = true;
    (*model)["byte_fallback"] = true;
    (*model)["ignore_merges"] = false;
    (*model)["continuing_subword_prefix"] = nullptr;
    (*model)["end_of_word_suffix"] = nullptr;
    (*model)["dropout"] = nullptr;
  }
}

// Names tokenizer_config.json in errors next to the tokenizer.json named `source`.
std::string config_source(const std::string& source) {
  constexpr std::string_view kName = "tokenizer.json";
  if (source.size() >= kName.size() && source.compare(source.size() - kName.size(), kName.size(), kName) == 0) {
    return source.substr(0, source.size() - kName.size()) + "tokenizer_config.json";
  }
  return source + " (tokenizer_config)";
}

Result<std::unique_ptr<Tokenizer>> build(std::string_view tokenizer_json, std::string_view config_json,
                                         const std::string& source, TokenizerFlavor flavor) {
  LRA_ASSIGN_OR_RETURN(json root, parse_json(tokenizer_json, source));
  LRA_RETURN_IF_ERROR(tokjson::expect_object(root, source));
  LRA_ASSIGN_OR_RETURN(const TokenizerConfig cfg, parse_config(config_json, config_source(source)));
  const bool transformers = flavor == TokenizerFlavor::kTransformers;
  if (transformers && (cfg.tokenizer_class == "LlamaTokenizer" || cfg.tokenizer_class == "LlamaTokenizerFast")) {
    rebuild_like_transformers_llama(root, cfg);
  }
  HfTokenizer::Parts parts;
  LRA_ASSIGN_OR_RETURN(parts.model, parse_model(root, source));
  if (const json* j = tokjson::find(root, "normalizer")) {
    LRA_ASSIGN_OR_RETURN(parts.normalizer, Normalizer::from_json(*j, tokjson::member(source, "normalizer")));
  }
  if (const json* j = tokjson::find(root, "pre_tokenizer")) {
    LRA_ASSIGN_OR_RETURN(parts.pre_tokenizer, PreTokenizer::from_json(*j, tokjson::member(source, "pre_tokenizer")));
  }
  if (const json* j = tokjson::find(root, "decoder")) {
    LRA_ASSIGN_OR_RETURN(parts.decoder, Decoder::from_json(*j, tokjson::member(source, "decoder")));
  }
  LRA_ASSIGN_OR_RETURN(auto added, parse_added_tokens(root, *parts.model, source));
  LRA_ASSIGN_OR_RETURN(parts.added, AddedVocabulary::build(std::move(added), parts.normalizer.get(),
                                                           tokjson::member(source, "added_tokens")));
  const json* post = tokjson::find(root, "post_processor");
  LRA_ASSIGN_OR_RETURN(parts.post, PostProcessor::from_json(post == nullptr ? json() : *post,
                                                            tokjson::member(source, "post_processor")));

  auto id_of = [&](const std::optional<std::string>& token) -> int32_t {
    if (!token) return -1;
    if (const AddedToken* t = parts.added.find_content(*token)) return t->id;
    return parts.model->token_to_id(*token);
  };
  parts.bos = id_of(cfg.bos_token);
  parts.eos = id_of(cfg.eos_token);
  // transformers rebuilds the post-processor as [bos] $A [eos] whenever the config sets either
  // flag (a flag whose token is missing is dropped); otherwise tokenizer.json's one stands.
  if (transformers && (cfg.add_bos_token || cfg.add_eos_token)) {
    parts.post = PostProcessor::bos_eos(cfg.add_bos_token.value_or(false) ? parts.bos : -1,
                                        cfg.add_eos_token.value_or(false) ? parts.eos : -1);
  }
  return std::unique_ptr<Tokenizer>(new HfTokenizer(std::move(parts)));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json,
                                                        std::string_view tokenizer_config_json,
                                                        const std::string& source, TokenizerFlavor flavor) {
  try {
    return build(tokenizer_json, tokenizer_config_json, source, flavor);
  } catch (const json::exception& e) {
    // Every access above is type-checked first; this only guards against a case missed there.
    return tokjson::corrupt(source, fmt::format("unexpected JSON shape: {}", e.what()));
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_dir(const std::string& dir, TokenizerFlavor flavor) {
  const std::string json_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  const std::string config_path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  LRA_ASSIGN_OR_RETURN(const std::string text, read_text_file(json_path));
  std::string config;
  if (std::error_code ec; std::filesystem::exists(config_path, ec)) {
    LRA_ASSIGN_OR_RETURN(config, read_text_file(config_path));
  }
  return from_json(text, config, json_path, flavor);
}

namespace {

// Bytes of trailing U+FFFD in `s`: text that may still be an incomplete UTF-8 sequence.
size_t trailing_replacement_bytes(std::string_view s) {
  constexpr std::string_view kFffd = "\xEF\xBF\xBD";
  size_t n = 0;
  while (s.size() >= n + kFffd.size() && s.substr(s.size() - n - kFffd.size(), kFffd.size()) == kFffd) {
    n += kFffd.size();
  }
  return n;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  if (tok_.decode_is_unstable(id)) return {};
  const std::string text = tok_.decode(ids_);
  assert(text.size() >= emitted_ && "StreamDecoder: decode() of a longer window got shorter");
  const size_t done = std::min(emitted_, text.size());  // keeps release builds in bounds regardless
  // Only U+FFFD after what was already returned can still change (the context's are final).
  const std::string_view fresh = std::string_view(text).substr(done);
  const size_t stable = text.size() - trailing_replacement_bytes(fresh);
  std::string out(fresh.substr(0, stable - done));
  emitted_ = stable;
  // At a clean boundary, restart the window from `id` alone: decoding `id` + later ids then
  // yields exactly the later ids' text after decode({id}), keeping each push O(window).
  // An id that decodes to no bytes cannot serve as context (e.g. Strip would hit the next id).
  if (stable == text.size() && !tok_.token_bytes(id).empty()) {
    ids_.assign(1, id);
    emitted_ = tok_.decode(ids_).size();
  }
  return out;
}

void StreamDecoder::prime(int32_t id) {
  if (!ids_.empty() || tok_.token_bytes(id).empty() || tok_.decode_is_unstable(id)) return;
  ids_.assign(1, id);
  emitted_ = tok_.decode(ids_).size();
}

std::string StreamDecoder::finish() {
  const std::string text = tok_.decode(ids_);
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  ids_.clear();
  emitted_ = 0;
  return out;
}

}  // namespace lragent
