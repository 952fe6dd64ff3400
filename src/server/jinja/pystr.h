// Python's string semantics on UTF-8 text, for the Jinja interpreter: templates index, slice,
// case-map and print strings as Python does (by code point, repr with Python's quoting).
//
// Unicode coverage is deliberately partial, as no Unicode database is at hand:
//  - case mapping (upper/lower/title/capitalize, islower/isupper) covers ASCII, Latin-1,
//    Latin Extended-A, Greek, Cyrillic, Armenian and fullwidth Latin, plus 'ß'.upper() == 'SS';
//    other letters are left as they are and count as uncased (no final-sigma rule);
//  - isalpha/isdigit/\w add the common CJK, kana and Hangul blocks and a few digit blocks;
//  - repr escapes the control, format, separator, surrogate and private-use code points Python
//    escapes; unassigned code points are printed as they are (Python escapes them).
// Whitespace (strip, split, isspace, Jinja's trim) is Python's exact set.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace lragent::server::jinja::py {

// Code points of UTF-8 text; a byte that is not part of valid UTF-8 becomes U+DC80+byte (Python's
// surrogateescape), which append_utf8 writes back as that byte, so no text is lost or rejected.
std::u32string decode(std::string_view s);
void append_utf8(std::string& out, char32_t c);
std::string encode(std::u32string_view s);
// Number of code points (what Python's len gives).
size_t length(std::string_view s);
bool is_ascii(std::string_view s);

bool is_space(char32_t c);  // str.isspace
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_word(char32_t c);  // regex \w
bool is_printable(char32_t c);
// Python's backslash escape of a code point: \xHH, \uHHHH or \UHHHHHHHH.
std::string escape_code_point(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
bool is_cased(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize
std::string title(std::string_view s);       // str.title (Jinja's title filter differs)
bool is_lower(std::string_view s);           // str.islower
bool is_upper(std::string_view s);

// str.strip/lstrip/rstrip: `chars` unset strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

// repr(str): quotes and escapes as Python does.
std::string repr_string(std::string_view s);
// repr(float): shortest round-trip digits, exponent form outside 1e-4 <= |x| < 1e16.
std::string repr_float(double d);
// json.dumps(str, ensure_ascii=False): quoted, with \" \\ \n \r \t \b \f and \u00XX escapes.
void append_json_string(std::string& out, std::string_view s);

// A string literal's value from the text between its quotes: Python's unicode-escape decoding
// (\n \t \\ \' \" \a \b \f \v, octal \ooo, \xhh \uhhhh \Uhhhhhhhh, a backslash-newline dropped, an
// unknown escape kept as written; jinja2's rule for a backslash before non-ASCII text: "\é" is
// "\xe9"). kInvalidArgument: a truncated hex escape, a code point past U+10FFFF or a surrogate
// (not UTF-8 text), \N{...}.
Result<std::string> unescape(std::string_view raw);

}  // namespace lragent::server::jinja::py
