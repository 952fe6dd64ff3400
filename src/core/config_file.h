// A command's flags from a file, as vLLM's `--config config.yaml` takes them: a flat YAML
// mapping of long flag names (without the leading "--") to values.
//
//   # lragent serve --config serve.yaml
//   model: /models/llama-3.1-8b
//   port: 8000
//   enable-lora: true
//   lora-modules:             # a list: one "- item" a line, or [a, b] on one line
//     - plan=/adapters/plan
//     - action=/adapters/action
//   override-generation-config: {"temperature": 0.5}   # a {...} value is kept as written (JSON)
//
// The subset read: `key: value` lines at column 0 (a key of letters, digits, '-' and '_', '_'
// read as '-', as vLLM reads max_model_len as max-model-len); a value plain (trimmed, up to a
// " #" comment), 'single-quoted' ('' for a quote) or "double-quoted" (YAML's escapes \" \\ \/ \n
// \t \r \b \f \0 \e \xHH \uHHHH \UHHHHHHHH); a flow list [a, 'b', "c"] of such scalars; a
// flow mapping {...} on one line, kept verbatim; or nothing, with indented "- item" lines
// after it. Comments (#, at a line's start or after a space), blank lines and the "---" / "..."
// document markers are skipped. Anything else is an error naming its line and what to write
// instead: nested mappings, anchors and aliases, tags, block scalars (| and >), multi-line
// flow collections, tabs as indentation, a key given twice, a key without a value.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent {

struct ConfigEntry {
  std::string key;                  // the flag's long name, '_' turned into '-'
  std::vector<std::string> values;  // one for a scalar; a list's items (none for [])
  bool list = false;                // written as a list
  int line = 0;                     // 1-based, of the key
};

// Errors are kInvalidArgument "SOURCE, line N: ..." (`source`: the file's name, for the message).
Result<std::vector<ConfigEntry>> parse_config_file(std::string_view text, const std::string& source);

}  // namespace lragent
