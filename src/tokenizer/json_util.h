// Checked access to tokenizer.json values: every failure is an Error naming the file, the JSON
// path and the cause, e.g. "m/tokenizer.json: model.merges[3]: token \"ab\" is not in the vocab".
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace lragent::tokjson {

using nlohmann::json;

// `where` for a member: "file: a.b" + key -> "file: a.b.key" (no dot right after the file name).
std::string member(std::string_view where, std::string_view key);
std::string element(std::string_view where, size_t index);  // "...[index]"

Error corrupt(std::string_view where, std::string_view cause);
Error unsupported(std::string_view where, std::string_view cause);

// The object at `where`; anything else is kCorrupt.
Status expect_object(const json& j, std::string_view where);
// obj[key] when present and not null.
const json* find(const json& obj, std::string_view key);

Result<std::string> get_string(const json& obj, std::string_view key, std::string_view where);
// Missing or null gives nullopt.
Result<std::optional<std::string>> get_optional_string(const json& obj, std::string_view key, std::string_view where);
// Missing or null gives `fallback`.
Result<bool> get_bool(const json& obj, std::string_view key, std::string_view where, bool fallback);
Result<int64_t> get_int(const json& obj, std::string_view key, std::string_view where, int64_t fallback);
// A string holding exactly one character (HF's `char` fields, e.g. Metaspace's replacement).
Result<std::string> get_char(const json& obj, std::string_view key, std::string_view where);
// A token id: an integer in [0, 2^31).
Result<int32_t> to_id(const json& j, std::string_view where);

}  // namespace lragent::tokjson
