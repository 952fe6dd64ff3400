#include "server/sampling_defaults.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/text_file.h"

namespace lragent::server {

using nlohmann::json;

namespace {

// transformers' GenerationConfig defaults: a file's value equal to one of these is not a
// recommendation (vLLM reads the file through to_diff_dict, which leaves them out).
struct HfDefault {
  const char* key;
  std::optional<double> value;  // none: HF has no default, any value counts
};
constexpr HfDefault kKeys[] = {{"temperature", 1.0}, {"top_p", 1.0},          {"top_k", 50.0},
                               {"min_p", std::nullopt}, {"repetition_penalty", 1.0}, {"max_new_tokens", std::nullopt}};

// Sets one parameter from `v`, checked as a request's field of that name is checked.
Status set(SamplingDefaults& d, const std::string& key, const json& v, ErrorCode code, const std::string& where) {
  auto fail = [&](const char* what) {
    return Error{code, fmt::format("{}: '{}' = {} must be {}", where, key, v.dump(), what)};
  };
  if (!v.is_number()) return fail("a number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) return fail("a finite number");
  const bool integer = v.is_number_integer() || v.is_number_unsigned();
  if (key == "temperature") {
    if (x < 0 || x > 100) return fail("from 0 to 100 (0: greedy)");
    d.temperature = x;
  } else if (key == "top_p") {
    if (x <= 0 || x > 1) return fail("in (0, 1]");
    d.top_p = x;
  } else if (key == "top_k") {
    if (!integer || x < -1 || x > std::numeric_limits<int32_t>::max()) return fail("an integer, -1 or 0 for off");
    d.top_k = x < 0 ? 0 : static_cast<int>(x);
  } else if (key == "min_p") {
    if (x < 0 || x > 1) return fail("in [0, 1]");
    d.min_p = x;
  } else if (key == "repetition_penalty") {
    if (x <= 0 || x > 100) return fail("in (0, 100] (1: off)");
    d.repetition_penalty = x;
  } else {  // max_new_tokens
    if (!integer || x < 1 || x > (1 << 24)) return fail("an integer of at least 1");
    d.max_tokens = static_cast<int>(x);
  }
  return Status::Ok();
}

}  // namespace

std::string SamplingDefaults::describe() const {
  const SamplingDefaults n;
  std::vector<std::string> parts;
  if (temperature != n.temperature) parts.push_back(fmt::format("temperature={}", temperature));
  if (top_p != n.top_p) parts.push_back(fmt::format("top_p={}", top_p));
  if (top_k != n.top_k) parts.push_back(fmt::format("top_k={}", top_k));
  if (min_p != n.min_p) parts.push_back(fmt::format("min_p={}", min_p));
  if (repetition_penalty != n.repetition_penalty) parts.push_back(fmt::format("repetition_penalty={}", repetition_penalty));
  if (max_tokens != n.max_tokens) parts.push_back(fmt::format("max_tokens={}", max_tokens));
  return fmt::format("{}", fmt::join(parts, ", "));
}

Result<SamplingDefaults> sampling_defaults_from(const json& generation_config, const std::string& where,
                                                const json& overrides) {
  if (!generation_config.is_object())
    return make_error(ErrorCode::kCorrupt, "{}: top level is not a JSON object", where);
  if (!overrides.is_object())
    return make_error(ErrorCode::kInvalidArgument,
                      "--override-generation-config must be a JSON object, like '{{\"temperature\": 0.5}}'");
  SamplingDefaults d;
  for (const HfDefault& k : kKeys) {
    const auto it = generation_config.find(k.key);
    if (it == generation_config.end() || it->is_null()) continue;
    if (k.value && it->is_number() && it->get<double>() == *k.value) continue;
    LRA_RETURN_IF_ERROR(set(d, k.key, *it, ErrorCode::kCorrupt, where));
  }
  for (const HfDefault& k : kKeys) {
    const auto it = overrides.find(k.key);
    if (it == overrides.end() || it->is_null()) continue;
    LRA_RETURN_IF_ERROR(set(d, k.key, *it, ErrorCode::kInvalidArgument, "--override-generation-config"));
  }
  return d;
}

Result<SamplingDefaults> load_sampling_defaults(const std::string& mode, const std::string& model_dir,
                                                const std::string& overrides_json) {
  json overrides = json::object();
  if (!overrides_json.empty()) {
    overrides = json::parse(overrides_json, nullptr, /*allow_exceptions=*/false);
    if (overrides.is_discarded())
      return make_error(ErrorCode::kInvalidArgument,
                        "--override-generation-config is not valid JSON: give an object, like '{{\"temperature\": 0.5}}'");
  }
  json config = json::object();
  if (mode != "vllm") {
    const bool own = mode == "auto";
    const std::string path = (std::filesystem::path(own ? model_dir : mode) / "generation_config.json").string();
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      LRA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
      LRA_ASSIGN_OR_RETURN(config, parse_json(text, path));
    } else if (!own) {
      return make_error(ErrorCode::kNotFound,
                        "--generation-config {}: no generation_config.json there (give \"auto\" for the model's own, "
                        "\"vllm\" for neutral defaults, or a directory that holds one)",
                        mode);
    }
    return sampling_defaults_from(config, path, overrides);
  }
  return sampling_defaults_from(config, "--generation-config vllm", overrides);
}

}  // namespace lragent::server
