// What the translations of other APIs into a chat completion share (responses_api.cpp,
// messages_api.cpp): reading a request's fields with errors that name them, and the random ids
// of the objects they answer with. Not part of the API.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server::translation {

inline Error bad(std::string msg) { return Error{ErrorCode::kInvalidArgument, std::move(msg)}; }
inline Error unsupported(std::string msg) { return Error{ErrorCode::kUnsupported, std::move(msg)}; }

// The field, or null when absent.
inline const nlohmann::ordered_json& field(const nlohmann::ordered_json& o, const char* name) {
  static const nlohmann::ordered_json kNull;
  const auto it = o.find(name);
  return it == o.end() ? kNull : *it;
}

// A string field; the error names it as `where.name`.
inline Result<std::string> get_string(const nlohmann::ordered_json& o, const char* name, const std::string& where) {
  const nlohmann::ordered_json& v = field(o, name);
  if (!v.is_string()) return bad(fmt::format("{}.{} must be a string", where, name));
  return v.get<std::string>();
}

// "<prefix>_<24 hex digits>": ids of items, blocks and answers (unique in practice, not secret).
inline std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}_{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

}  // namespace lragent::server::translation
