#include "tokenizer/json_util.h"

#include <limits>

#include "tokenizer/unicode.h"

namespace lragent::tokjson {

std::string member(std::string_view where, std::string_view key) {
  // The first member after the bare file name starts the JSON path.
  const bool has_path = where.find(": ") != std::string_view::npos;
  return fmt::format("{}{}{}", where, has_path ? "." : ": ", key);
}

std::string element(std::string_view where, size_t index) { return fmt::format("{}[{}]", where, index); }

Error corrupt(std::string_view where, std::string_view cause) {
  return make_error(ErrorCode::kCorrupt, "{}: {}", where, cause);
}

Error unsupported(std::string_view where, std::string_view cause) {
  return make_error(ErrorCode::kUnsupported, "{}: {}", where, cause);
}

Status expect_object(const json& j, std::string_view where) {
  if (!j.is_object()) return corrupt(where, fmt::format("expected an object, got {}", j.type_name()));
  return Status::Ok();
}

const json* find(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::string> get_string(const json& obj, std::string_view key, std::string_view where) {
  const json* v = find(obj, key);
  if (v == nullptr) return corrupt(member(where, key), "missing");
  if (!v->is_string()) return corrupt(member(where, key), fmt::format("expected a string, got {}", v->type_name()));
  return v->get<std::string>();
}

Result<std::optional<std::string>> get_optional_string(const json& obj, std::string_view key, std::string_view where) {
  const json* v = find(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return corrupt(member(where, key), fmt::format("expected a string, got {}", v->type_name()));
  return std::optional<std::string>(v->get<std::string>());
}

Result<bool> get_bool(const json& obj, std::string_view key, std::string_view where, bool fallback) {
  const json* v = find(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return corrupt(member(where, key), fmt::format("expected a boolean, got {}", v->type_name()));
  return v->get<bool>();
}

Result<int64_t> get_int(const json& obj, std::string_view key, std::string_view where, int64_t fallback) {
  const json* v = find(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) {
    return corrupt(member(where, key), fmt::format("expected an integer, got {}", v->type_name()));
  }
  return v->get<int64_t>();
}

Result<std::string> get_char(const json& obj, std::string_view key, std::string_view where) {
  LRA_ASSIGN_OR_RETURN(std::string s, get_string(obj, key, where));
  size_t len = 0;
  if (s.empty() || (unicode::decode_utf8(s, 0, &len), len != s.size())) {
    return corrupt(member(where, key), fmt::format("expected exactly one character, got \"{}\"", s));
  }
  return s;
}

Result<int32_t> to_id(const json& j, std::string_view where) {
  if (!j.is_number_integer()) return corrupt(where, fmt::format("expected a token id, got {}", j.type_name()));
  // Tables are sized by the largest id: one far past any real vocabulary (the largest have ~256k)
  // would allocate billions of entries, and INT32_MAX + 1 would overflow the size.
  constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;
  const bool in_range = j.is_number_unsigned() ? j.get<uint64_t>() <= uint64_t{kMaxId}
                                               : j.get<int64_t>() >= 0 && j.get<int64_t>() <= kMaxId;
  if (!in_range) return corrupt(where, fmt::format("token id {} is out of range (0 to {})", j.dump(), kMaxId));
  const int64_t id = j.get<int64_t>();
  return static_cast<int32_t>(id);
}

}  // namespace lragent::tokjson
