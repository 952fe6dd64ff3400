// Reading small text files and parsing JSON without letting an exception escape; shared by the
// loaders of config.json, *.index.json, adapter_config.json, tokenizer files, replay scripts,
// trajectory bundles and question files.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"

namespace lragent {

// Reads a whole file. A missing file is kNotFound; a directory or another failure is kIo; both
// name the path.
Result<std::string> read_text_file(const std::string& path);

// Parses JSON. Errors are kCorrupt "SOURCE: invalid JSON (parse error at line 3, column 7: ...)"
// (kOutOfMemory if the document does not fit).
Result<nlohmann::json> parse_json(std::string_view text, const std::string& source);

}  // namespace lragent
