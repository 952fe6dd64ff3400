// UTF-8 and Unicode helpers for the tokenizer, matching the Rust behaviour that HF `tokenizers`
// relies on (String::from_utf8_lossy, char::is_whitespace, NFC from unicode-normalization).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lragent::unicode {

// Decodes the code point starting at s[i] of VALID UTF-8 and stores its byte length in *len.
char32_t decode_utf8(std::string_view s, size_t i, size_t* len);
// Byte length of the character whose lead byte is `lead`, in valid UTF-8.
inline size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }
void append_utf8(std::string& out, char32_t cp);

bool is_valid_utf8(std::string_view bytes);
// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence becomes one U+FFFD.
std::string from_utf8_lossy(std::string_view bytes);

// Unicode White_Space (Rust char::is_whitespace, Oniguruma's \s).
bool is_white_space(char32_t cp);

// Unicode Normalization Form C of valid UTF-8.
std::string nfc(std::string_view s);

// GPT-2 byte-level alphabet: every byte maps to one printable code point and back.
char32_t byte_to_char(uint8_t b);
int byte_from_char(char32_t c);  // -1 if `c` is not in the byte-level alphabet

}  // namespace lragent::unicode
