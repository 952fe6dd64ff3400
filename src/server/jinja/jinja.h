// A Jinja interpreter for HuggingFace chat templates: renders a model's chat_template
// (tokenizer_config.json) as transformers' apply_chat_template does, i.e. as jinja2 3.1's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
// extension, transformers' {% generation %} tag, its tojson filter (json.dumps with
// ensure_ascii=False) and its raise_exception / strftime_now globals, with Python's value
// semantics. tests/server/jinja_test.cpp checks it against jinja2 itself
// (scripts/goldens/jinja_goldens.py).
//
// Not supported (an error, never a different rendering): template inheritance and includes
// (extends, block, include, import), recursive for loops, integers past 64 bits, \N{...} string
// escapes, non-ASCII identifiers, the cycler and lipsum globals, str.format fields with
// attribute or item lookups, and the filters chat templates do not use (groupby, slice,
// truncate, wordwrap, urlize, urlencode, xmlattr, filesizeformat, pprint, random, striptags,
// forceescape). A namespace attribute cannot be set to a namespace or loop object.
//
// Known differences (none in what the chat templates tested print): range() and dict.keys(),
// .values(), .items() give lists (printing one shows a list, not a range or view); the
// generators of map, select, ... print without an address and can be iterated more than once;
// Unicode case mapping and character classes are partial (pystr.h); Markup is not tracked, so
// escape() after safe escapes again; an unknown filter or test in a branch jinja2's optimizer
// drops (`{{ 'x' or y | nofilter }}`) is still an error.
//
// Errors: a syntax error is kCorrupt when the template is parsed; anything failing while
// rendering is kInvalidArgument. Both name the line and column. A template's own
// raise_exception(message) error carries the message verbatim after kRaisedPrefix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace lragent::server::jinja {

struct Stmt;

// Marks the message of a template's raise_exception() in an error: "...: raise_exception: <msg>".
inline constexpr std::string_view kRaisedPrefix = "raise_exception: ";

struct RenderOptions {
  // strftime_now(format) in templates; unset: the local time now, as transformers gives it.
  std::function<std::string(const std::string& format)> strftime_now;
  // Bounds on one render, so that no template can run away: the bytes of output and of any one
  // string or list it builds, evaluation steps (expressions, statements, loop iterations, and
  // work inside filters), and macro calls inside each other. (Rendering also stops a template
  // nesting deeper than 1 MiB of stack: call it on a thread with more than that to spare.)
  size_t max_output_bytes = 64 << 20;
  int64_t max_steps = 50'000'000;
  int max_depth = 200;
};

class Template {
 public:
  static Result<Template> parse(std::string_view source);

  // `variables` must be a JSON object: messages, tools, add_generation_prompt, bos_token, ...
  Result<std::string> render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> program_;
};

// The local time formatted by strftime (the default strftime_now).
std::string strftime_local_now(const std::string& format);

}  // namespace lragent::server::jinja
