// Function calls written as a Python list, as models of the "pythonic" tool-call format write them
// (vLLM's pythonic parser: Llama 3.2 and 4 with its pythonic templates, ToolACE, many small
// models): [get_weather(city="Paris", units="metric"), get_time()]. vLLM reads them with Python's
// ast; this is the subset ast gives it: a list of calls of plain names with keyword arguments whose
// values are literals (strings, numbers, True / False / None, lists and dicts of them).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lragent::server {

// The characters the reader takes for whitespace, digits and names, PyCallsStream too (both must
// read the same text alike).
namespace pychars {
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
inline bool is_ident(char c) { return is_ident_start(c) || is_digit(c); }
}  // namespace pychars

struct PythonCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // keyword -> value, in order
};

// The calls of `text` when the whole of it (after leading and trailing whitespace) is such a list,
// else nullopt. Strings: '...' "..." and triple-quoted, r/R raw prefixes, Python's escapes (decoded
// as a Jinja string literal's: jinja::py::unescape), adjacent literals joined. Numbers: decimal integers
// within 64 bits and floats, a leading minus (vLLM's ast walk refuses -1; it is taken here). JSON's
// true / false / null are read as True / False / None (a call forced by a guide writes JSON values:
// forced_tool_calls_regex). Dict keys: strings, or integers written as JSON writes them (strings).
// Refused: positional arguments, a keyword given twice, attribute calls (a.b()), tuples, sets,
// expressions, nesting deeper than 64.
std::optional<std::vector<PythonCall>> parse_python_calls(std::string_view text);

// One value as a keyword's value is read there (a number, a string, True / False / None, a list or
// dict of them), when the whole of `text` (after leading and trailing whitespace) is one; else
// nullopt. PyCallsStream settles numbers with it, so that both read them alike.
std::optional<nlohmann::ordered_json> parse_python_value(std::string_view text);

// Whether `s` is a name the reader takes for a function or keyword: [A-Za-z_][A-Za-z0-9_]*.
bool is_python_name(std::string_view s);

}  // namespace lragent::server
