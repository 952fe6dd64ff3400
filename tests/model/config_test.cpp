#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "test_util.h"

namespace lragent {
namespace {

using json = nlohmann::json;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// A small valid Llama config; tests patch single keys.
json llama_json() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": null})");
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "test/config.json"); }

Error parse_error(const json& j) {
  auto r = parse(j);
  EXPECT_FALSE(r.ok()) << j.dump();
  if (r.ok()) return Error{};
  EXPECT_TRUE(Contains(r.error().message, "test/config.json"));
  return r.error();
}

TEST(ModelConfig, LoadsTinyStoriesLlama) {
  auto cfg = load_model_config(testing::tinystories_dir());
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->architecture, "LlamaForCausalLM");
  EXPECT_EQ(cfg->vocab_size, 2048);
  EXPECT_EQ(cfg->hidden_size, 128);
  EXPECT_EQ(cfg->intermediate_size, 384);
  EXPECT_EQ(cfg->num_layers, 2);
  EXPECT_EQ(cfg->num_heads, 8);
  EXPECT_EQ(cfg->num_kv_heads, 4);
  EXPECT_EQ(cfg->head_dim, 16);
  EXPECT_EQ(cfg->max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(cfg->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 10000.0);
  EXPECT_TRUE(cfg->rope_scaling.type.empty());
  EXPECT_TRUE(cfg->tie_word_embeddings);
  EXPECT_FALSE(cfg->attention_bias);
  EXPECT_EQ(cfg->bos_token_id, 1);
  EXPECT_EQ(cfg->eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(cfg->torch_dtype, "float32");
}

TEST(ModelConfig, LlamaDefaultsAndAttentionBias) {
  json j = llama_json();
  j.erase("num_key_value_heads");
  j.erase("max_position_embeddings");
  j["attention_bias"] = true;
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->num_kv_heads, 4) << "defaults to num_attention_heads";
  EXPECT_EQ(cfg->max_position_embeddings, 2048);
  EXPECT_TRUE(cfg->attention_bias);
  EXPECT_FALSE(cfg->tie_word_embeddings) << "Llama default";
}

TEST(ModelConfig, MistralWithNullHeadDimAndSlidingWindow) {
  json j = llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  j["head_dim"] = nullptr;
  j["sliding_window"] = 4096;
  j["attention_bias"] = true;  // not a Mistral key: ignored
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->architecture, "MistralForCausalLM");
  EXPECT_EQ(cfg->head_dim, 16);
  EXPECT_FALSE(cfg->attention_bias);
  EXPECT_FALSE(cfg->tie_word_embeddings);
}

TEST(ModelConfig, Qwen2HasQkvBiasAndExplicitTying) {
  json j = llama_json();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["tie_word_embeddings"] = true;
  j["eos_token_id"] = {151643, 151645};
  j["bos_token_id"] = nullptr;
  j["use_sliding_window"] = false;
  j["torch_dtype"] = "bfloat16";
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_TRUE(cfg->attention_bias);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  EXPECT_EQ(cfg->eos_token_ids, (std::vector<int>{151643, 151645}));
  EXPECT_EQ(cfg->bos_token_id, -1);
  EXPECT_EQ(cfg->torch_dtype, "bfloat16");
}

TEST(ModelConfig, ExplicitHeadDim) {
  json j = llama_json();
  j["head_dim"] = 32;  // heads * head_dim != hidden_size, as in some Mistral/Qwen models
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->head_dim, 32);
}

TEST(ModelConfig, Llama3RopeScalingBothSpellings) {
  for (const char* key : {"rope_type", "type"}) {
    json j = llama_json();
    j["rope_scaling"] = {{key, "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    auto cfg = parse(j);
    ASSERT_TRUE(cfg.ok()) << cfg.error().message;
    EXPECT_EQ(cfg->rope_scaling.type, "llama3");
    EXPECT_DOUBLE_EQ(cfg->rope_scaling.factor, 8.0);
    EXPECT_DOUBLE_EQ(cfg->rope_scaling.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(cfg->rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(cfg->rope_scaling.original_max_position_embeddings, 8192);
  }
  json j = llama_json();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
  auto linear = parse(j);
  ASSERT_TRUE(linear.ok()) << linear.error().message;
  EXPECT_EQ(linear->rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(linear->rope_scaling.factor, 2.0);
  EXPECT_EQ(linear->max_position_embeddings, 512) << "linear scaling stretches the config's 256 positions";
}

// transformers v5 writes rope_theta and the scaling into rope_parameters (and may drop the
// legacy keys): both are read from there, and win over the legacy ones.
TEST(ModelConfig, TransformersV5RopeParameters) {
  json j = llama_json();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->rope_theta, 250000.0);
  EXPECT_EQ(cfg->rope_scaling.type, "");
  j["rope_theta"] = 10000.0;  // a stale legacy key loses
  j["rope_parameters"] = {{"rope_type", "llama3"},     {"rope_theta", 500000.0},      {"factor", 8.0},
                          {"low_freq_factor", 1.0},    {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 64}};
  cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->rope_theta, 500000.0);
  EXPECT_EQ(cfg->rope_scaling.type, "llama3");
  EXPECT_EQ(cfg->rope_scaling.factor, 8.0);
  EXPECT_EQ(cfg->rope_scaling.original_max_position_embeddings, 64);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  Error e = parse_error(j);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "rope_parameters type 'yarn' is not supported"));
  j["rope_parameters"] = {{"rope_type", "linear"}};
  e = parse_error(j);
  EXPECT_TRUE(Contains(e.message, "rope_parameters.factor"));
}

// Parts of a checkpoint's architecture the forward pass does not compute are refused, not
// ignored (the model would load and compute something else).
TEST(ModelConfig, RefusesArchitecturePartsItDoesNotCompute) {
  json j = llama_json();
  j["mlp_bias"] = true;
  Error e = parse_error(j);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "mlp_bias is true"));
  j = llama_json();
  j["hidden_act"] = "gelu";
  e = parse_error(j);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "hidden_act 'gelu' is not supported"));
  j["hidden_act"] = 3;
  EXPECT_EQ(parse_error(j).code, ErrorCode::kCorrupt);
  for (const char* act : {"silu", "swish"}) {
    j["hidden_act"] = act;
    EXPECT_TRUE(parse(j).ok()) << act;
  }
}

// A sliding window narrower than the context caps the context there (where full attention is
// what sliding-window attention computes); a wider one, or none, changes nothing.
TEST(ModelConfig, SlidingWindowNarrowerThanTheContextCapsIt) {
  json j = llama_json();  // max_position_embeddings 256
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 64;
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->max_position_embeddings, 64);
  EXPECT_EQ(cfg->sliding_window, 64);
  j["sliding_window"] = nullptr;  // Mistral v0.2 and later
  cfg = parse(j);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->max_position_embeddings, 256);
  EXPECT_EQ(cfg->sliding_window, 0);
  j["sliding_window"] = -5;
  EXPECT_EQ(parse_error(j).code, ErrorCode::kCorrupt);
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["sliding_window"] = 64;
  j["use_sliding_window"] = false;
  cfg = parse(j);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->max_position_embeddings, 256) << "Qwen2 attends fully unless use_sliding_window";
  j["use_sliding_window"] = true;
  cfg = parse(j);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->max_position_embeddings, 64);
  j["architectures"] = {"LlamaForCausalLM"};  // no window in Llama
  cfg = parse(j);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->max_position_embeddings, 256);
}

TEST(ModelConfig, RopeScalingErrors) {
  json j = llama_json();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  Error e = parse_error(j);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_TRUE(Contains(e.message, "rope_scaling type 'yarn' is not supported; supported: llama3, linear"));

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_TRUE(Contains(parse_error(j).message, "missing required key 'rope_scaling.low_freq_factor'"));

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_TRUE(Contains(parse_error(j).message, "low_freq_factor < high_freq_factor"));
}

TEST(ModelConfig, Qwen3NormsQAndKAndReadsItsOwnHeadDim) {
  json j = llama_json();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 128;  // Qwen3-0.6B: 16 heads of 128 against hidden 1024
  j.erase("max_position_embeddings");
  j["use_sliding_window"] = false;
  j["sliding_window"] = 64;  // ignored while use_sliding_window is false
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_TRUE(cfg->qk_norm);
  EXPECT_EQ(cfg->head_dim, 128);
  EXPECT_FALSE(cfg->attention_bias) << "Qwen3 reads attention_bias (default false), unlike Qwen2";
  EXPECT_EQ(cfg->max_position_embeddings, 32768);
  EXPECT_EQ(cfg->sliding_window, 0);
  j["attention_bias"] = true;
  j["use_sliding_window"] = true;
  auto biased = parse(j);
  ASSERT_TRUE(biased.ok()) << biased.error().message;
  EXPECT_TRUE(biased->attention_bias);
  EXPECT_EQ(biased->max_position_embeddings, 64) << "the window caps the context";
  j["model_type"] = "qwen3";
  j.erase("architectures");
  auto by_type = parse(j);
  ASSERT_TRUE(by_type.ok()) << by_type.error().message;
  EXPECT_EQ(by_type->architecture, "Qwen3ForCausalLM");
  auto llama = parse(llama_json());
  ASSERT_TRUE(llama.ok());
  EXPECT_FALSE(llama->qk_norm);
}

TEST(ModelConfig, UnknownArchitectureIsUnsupported) {
  json j = llama_json();
  j["architectures"] = {"GPT2LMHeadModel"};
  Error e = parse_error(j);
  EXPECT_EQ(e.code, ErrorCode::kUnsupported);
  EXPECT_EQ(e.message,
            "test/config.json: architecture 'GPT2LMHeadModel' is not supported; supported: LlamaForCausalLM, "
            "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM");
}

TEST(ModelConfig, BadJsonIsCorrupt) {
  auto r = parse_model_config("{\"hidden_size\": 64,", "dir/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
  EXPECT_TRUE(Contains(r.error().message, "dir/config.json: invalid JSON"));
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  EXPECT_TRUE(Contains(parse_error(json::array()).message, "not a JSON object"));
}

TEST(ModelConfig, MissingKeysAndWrongTypesNameTheKey) {
  json j = llama_json();
  j.erase("hidden_size");
  Error e = parse_error(j);
  EXPECT_EQ(e.code, ErrorCode::kCorrupt);
  EXPECT_EQ(e.message, "test/config.json: missing required key 'hidden_size'");

  j = llama_json();
  j["hidden_size"] = "64";
  EXPECT_EQ(parse_error(j).message, "test/config.json: 'hidden_size' must be an integer, got string");
  j = llama_json();
  j["num_attention_heads"] = 4.5;
  EXPECT_TRUE(Contains(parse_error(j).message, "'num_attention_heads' must be an integer, got a float"));
  j = llama_json();
  j["rope_theta"] = "big";
  EXPECT_TRUE(Contains(parse_error(j).message, "'rope_theta' must be a number"));
  j = llama_json();
  j["tie_word_embeddings"] = 1;
  EXPECT_TRUE(Contains(parse_error(j).message, "'tie_word_embeddings' must be true or false"));
  j = llama_json();
  j["eos_token_id"] = {"</s>"};
  EXPECT_TRUE(Contains(parse_error(j).message, "'eos_token_id' list entries must be token ids"));
  j = llama_json();
  j["architectures"] = "LlamaForCausalLM";
  EXPECT_TRUE(Contains(parse_error(j).message, "'architectures' must be a non-empty list of strings"));
  j = llama_json();
  j["vocab_size"] = 1ll << 40;
  EXPECT_TRUE(Contains(parse_error(j).message, "'vocab_size' value 1099511627776 is out of range"));
}

TEST(ModelConfig, ValidateChecksSizes) {
  json j = llama_json();
  j["num_key_value_heads"] = 3;
  EXPECT_TRUE(Contains(parse_error(j).message, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"));
  j = llama_json();
  j["intermediate_size"] = 0;
  EXPECT_TRUE(Contains(parse_error(j).message, "intermediate_size must be positive, got 0"));
  j = llama_json();
  j["hidden_size"] = 66;
  EXPECT_TRUE(Contains(parse_error(j).message, "hidden_size 66 is not divisible by num_attention_heads 4"));
  j = llama_json();
  j["num_attention_heads"] = 0;
  EXPECT_TRUE(Contains(parse_error(j).message, "num_attention_heads must be positive"));
}

TEST(ModelConfig, ModelTypeFallbackAndMissingFile) {
  json j = llama_json();
  j.erase("architectures");
  j["model_type"] = "qwen2";
  auto cfg = parse(j);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  EXPECT_EQ(cfg->architecture, "Qwen2ForCausalLM");

  auto missing = load_model_config("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(missing.error().message, "no config.json in /nonexistent/model"));
}

}  // namespace
}  // namespace lragent
