#include "core/text_file.h"

#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>

#include <nlohmann/json.hpp>

namespace lragent {

Result<std::string> read_text_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return make_error(ErrorCode::kNotFound, "{}: file not found", path);
  if (std::filesystem::is_directory(path, ec)) return make_error(ErrorCode::kIo, "{}: is a directory, not a file", path);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  if (in) ss << in.rdbuf();
  if (!in || in.bad()) return make_error(ErrorCode::kIo, "{}: cannot read the file", path);
  return ss.str();
}

Result<nlohmann::json> parse_json(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a huge number
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix: the position and cause remain.
    std::string_view what = e.what();
    if (auto p = what.find("] "); p != std::string_view::npos) what.remove_prefix(p + 2);
    return make_error(ErrorCode::kCorrupt, "{}: invalid JSON ({})", source, what);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kOutOfMemory, "{}: out of memory while parsing JSON", source);
  }
}

}  // namespace lragent
