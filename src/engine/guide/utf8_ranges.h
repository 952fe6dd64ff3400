// Code point sets as UTF-8 byte ranges, shared by the two structured-output front ends (the
// regex compiler, byte_dfa.h, and the grammar compiler, grammar.h): both turn a character class
// into alternatives of byte-range sequences so that their automata only ever see bytes. Also the
// hex digits of the \xHH / \uHHHH escapes both read as code points.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace lragent::guide {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges [lo, hi]

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

inline bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
inline uint32_t hex_value(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }  // of an is_hex digit

// The length of the well-formed UTF-8 character at s[pos] (its code point in *cp), or 0.
// Well-formed per Unicode table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF.
int utf8_char(std::string_view s, size_t pos, uint32_t* cp);

// Encodes a code point (not a surrogate, <= U+10FFFF) into out[0..4); returns the length.
int utf8_encode(uint32_t cp, uint8_t* out);

// One alternative of a class: n bytes, the i-th in [lo[i], hi[i]].
struct Seq {
  int n = 0;
  std::array<uint8_t, 4> lo{}, hi{};
};

// Appends the byte-range sequences matching exactly the UTF-8 encodings of [lo, hi]
// (surrogates left out): the utf8-ranges construction of RE2 and Rust's regex-syntax.
void utf8_seqs(uint32_t lo, uint32_t hi, std::vector<Seq>& out);

// Sorted, overlapping and adjacent ranges merged.
Ranges normalize(Ranges r);

// Every code point (surrogates included; utf8_seqs drops them) outside r.
Ranges negate(const Ranges& r);

// utf8_seqs over every range of `set` (normalized first).
std::vector<Seq> class_seqs(const Ranges& set);

}  // namespace lragent::guide
