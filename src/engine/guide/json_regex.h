// JSON schemas (vLLM's guided_json, OpenAI's response_format json_schema), json_object and
// guided_choice as regular expressions, for the byte DFA of guided decoding (byte_dfa.h). A guided
// completion is a whole match of the regex, so every regex here describes complete JSON texts.
//
// The dialect emitted is the DFA's and, at the same time, valid std::regex ECMAScript (the tests'
// reference): concatenation, |, (?: ) groups, * + ? {m} {m,} {m,n} (counts <= 1000, ByteDfa's
// largest), classes with ranges, \d \w \xHH and \ before punctuation; non-ASCII characters as
// their UTF-8 bytes. No anchors, no capturing groups, no backreferences.
//
// The schema subset. Everything else that constrains values is refused (kUnsupported, naming the
// keyword and its JSON pointer), never ignored: a guided output must validate against the schema.
// Where a schema allows more than a regex says simply, the regex allows a part of it (a narrowing:
// every output still validates), as noted below.
//   - `true` / `{}`: any JSON value of nesting up to max_depth; `false`: no value.
//   - Annotations are ignored: title, description, default, examples, $schema, $id, $comment,
//     deprecated, readOnly, writeOnly, discriminator (pydantic's note on a oneOf); $defs and
//     definitions are read only through $ref.
//   - `type`: one name or a list (an alternation). Without `type`, the keywords present name the
//     types (`properties` -> object, `minLength` -> string, ...); with none of them, any value.
//     Keywords of a type the schema does not allow are ignored, as JSON Schema says (an integer's
//     `format: int64`).
//   - `enum` / `const`: each value as nlohmann's compact dump() writes it (so an object value
//     without spaces); beside a `type`, the values of other types are dropped. No other constraint
//     may stand beside them, nor beside anyOf / oneOf / allOf / $ref.
//   - string: one of `minLength` / `maxLength` (characters: one raw character or one escape; a \u
//     escape of a surrogate is left out so that a pair cannot count twice), `pattern`, or `format`:
//     date (days per month and leap years checked, years 0001-9999), time (RFC 3339 full-time:
//     offset required, no leap second), date-time, uuid, email (a plain dot-atom form).
//     `pattern` is embedded as a group with a leading ^ and a trailing $ stripped (JSON Schema
//     searches; the regex makes it a whole match). It describes the value's raw characters, so the
//     value holds no escapes but those the pattern names: a character JSON must escape, written
//     outside a class, becomes its escape (\" \\ \n \u0001); `.` and negated classes exclude the
//     quote, the backslash and control characters, and a positive class drops them. \d \w are ASCII; \s is a space;
//     \D \W \S are their printable ASCII members; `.` also excludes U+2028 / U+2029 (ECMAScript's
//     line terminators). Refused: lookarounds, named groups, backreferences, \b, inner anchors,
//     and \d \w \D \W \S inside a negated class (their Unicode members differ between validators).
//   - integer: -?(?:0|[1-9][0-9]*); `minimum` / `maximum` / `exclusiveMinimum` /
//     `exclusiveMaximum` (numbers within 1e18, or draft 4's booleans) as exact decimal ranges;
//     `multipleOf` 1 only.
//   - number: the JSON number grammar; of the bounds only `minimum: 0` (no minus sign) and
//     `exclusiveMinimum: 0` (no minus sign, a nonzero digit within 15 zeros of the point, no
//     negative exponent: a tinier literal would parse as 0.0).
//   - boolean, null.
//   - object: `properties` in the order given (an output writes its keys in that order),
//     `required`, optional properties present or absent with the commas right. Closed:
//     `additionalProperties` absent (a narrowing) or false. Without `properties`,
//     `additionalProperties` true or a schema (or `{"type": "object"}` alone) is a map from any
//     string key to such values (to any value of nesting up to max_depth - 1 for true).
//   - array: `items` (a schema or false), `prefixItems` (all of them written unless maxItems
//     stops them; further elements only under a schema `items`, or as minItems asks),
//     `minItems` / `maxItems`, `uniqueItems: false`. Without `items`, elements are any value of
//     nesting up to max_depth - 1.
//   - `anyOf` / `oneOf` (an alternation: oneOf's exclusivity is not enforced, so a value valid
//     under two branches may be produced), `allOf` with one schema.
//   - `$ref` to a local JSON pointer ("#/$defs/Name", "#/definitions/Name", "#"). A recursive
//     reference expands max_depth times along a path; below that the branches that need it are
//     dropped (an optional property, an anyOf branch, an array left empty when minItems allows),
//     and a schema that needs it regardless accepts no value (kInvalidArgument).
// Whitespace is opts.whitespace after every ':' and ',' and nowhere else. A regex over 1 MiB is
// refused (kInvalidArgument); ByteDfa's own cap on NFA states often binds first (an untyped
// value's regex grows 4x per level of nesting).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent::guide {

struct JsonRegexOptions {
  // Nesting of untyped values (json_object, `{}` schemas, `{"type": "object"}` alone) and the
  // expansions of a recursive $ref along a path. 1..kMaxJsonDepth.
  int max_depth = 4;
  // A regex between tokens (after ':' and ','), a single atom or a group. outlines' default: a
  // model cannot loop on whitespace.
  std::string whitespace = "[ ]?";
};

// json_object's regex at 5 fits ByteDfa's NFA cap (a `{}` schema's only to 4); at 6 neither does.
inline constexpr int kMaxJsonDepth = 5;

// The regex of the JSON texts valid under `schema` (the subset above). Errors: kUnsupported naming
// the keyword and its JSON pointer ("'minimum' at /properties/age is not supported ..."),
// kInvalidArgument for a malformed schema, one no value satisfies, or one too large.
// Properties are written in the order `schema` holds them: parse it as ordered_json to keep the
// order the user gave (a model writes better in it: reasoning before an answer, say).
Result<std::string> json_schema_regex(const nlohmann::ordered_json& schema, const JsonRegexOptions& opts = {});
// The same on a nlohmann::json, whose objects hold their keys sorted: properties come in key order.
Result<std::string> json_schema_regex(const nlohmann::json& schema, const JsonRegexOptions& opts = {});

// Any JSON object ({"type": "json_object"} in OpenAI's response_format) of nesting up to
// opts.max_depth (clamped to 1..kMaxJsonDepth), an object of scalars being nesting 1.
std::string json_object_regex(const JsonRegexOptions& opts = {});

// One of the strings exactly (vLLM's guided_choice). `choices` must not be empty (the regex of no
// choice would match the empty text); the server refuses an empty list before calling.
std::string choice_regex(const std::vector<std::string>& choices);

// `literal` matched exactly: regex metacharacters escaped, control bytes as \xHH, other bytes
// (UTF-8 included) as they are.
std::string escape_regex(std::string_view literal);

}  // namespace lragent::guide
