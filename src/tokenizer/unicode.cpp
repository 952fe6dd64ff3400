#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace lragent::unicode {

char32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_length(b0);
  *len = n;
  if (n == 1) return b0;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i], or 0 if ill-formed; in that case
// *bad gets the length of the maximal subpart to replace (at least 1), per Unicode 3.9 / Rust.
size_t well_formed_length(std::string_view s, size_t i, size_t* bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *bad = 1;
  if (b0 < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    *bad = k + 1;
  }
  return n;
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  size_t i = 0, bad = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const size_t n = well_formed_length(bytes, i, &bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string from_utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0, bad = 0;
  while (i < bytes.size()) {
    const size_t n = well_formed_length(bytes, i, &bad);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      // `bad` is the length of the maximal subpart: the lead byte and its valid continuations.
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

constexpr char32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

// Lookup structures built once from the generated tables.
struct NfcData {
  std::unordered_map<char32_t, std::pair<char32_t, char32_t>> decomposition;
  std::unordered_map<uint64_t, char32_t> composition;  // (first << 32 | second) -> composite

  NfcData() {
    for (const auto& d : canonical_decompositions()) {
      decomposition.emplace(d.cp, std::make_pair(char32_t{d.first}, char32_t{d.second}));
      if (d.composes) composition.emplace((uint64_t{d.first} << 32) | d.second, d.cp);
    }
  }
};

const NfcData& nfc_data() {
  static const NfcData data;
  return data;
}

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const auto ranges = combining_class_ranges();
  auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                             [](char32_t v, const CombiningClassRange& r) { return v < r.lo; });
  if (it == ranges.begin()) return 0;
  --it;
  return c <= it->hi ? static_cast<uint8_t>(it->ccc) : 0;
}

void decompose(const NfcData& data, char32_t c, std::vector<char32_t>& out) {
  if (c >= kHangulS && c < kHangulS + kHangulSCount) {
    const char32_t s = c - kHangulS;
    out.push_back(kHangulL + s / kHangulNCount);
    out.push_back(kHangulV + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulT + s % kHangulTCount);
    return;
  }
  const auto it = data.decomposition.find(c);
  if (it == data.decomposition.end()) {
    out.push_back(c);
    return;
  }
  decompose(data, it->second.first, out);
  if (it->second.second != 0) decompose(data, it->second.second, out);
}

// Primary composite of a starter and a following character, or 0.
char32_t compose(const NfcData& data, char32_t a, char32_t b) {
  if (a >= kHangulL && a < kHangulL + kHangulLCount && b >= kHangulV && b < kHangulV + kHangulVCount) {
    return kHangulS + ((a - kHangulL) * kHangulVCount + (b - kHangulV)) * kHangulTCount;
  }
  if (a >= kHangulS && a < kHangulS + kHangulSCount && (a - kHangulS) % kHangulTCount == 0 && b > kHangulT &&
      b < kHangulT + kHangulTCount) {
    return a + (b - kHangulT);
  }
  const auto it = data.composition.find((uint64_t{a} << 32) | b);
  return it == data.composition.end() ? 0 : it->second;
}

}  // namespace

std::string nfc(std::string_view s) {
  // Everything below U+0300 is already NFC and never composes; those chars' UTF-8 bytes are < 0xCC.
  if (std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0xCC; })) {
    return std::string(s);
  }
  const NfcData& data = nfc_data();
  // chars: [n] code points, fully decomposed, then canonically ordered.
  std::vector<char32_t> chars;
  chars.reserve(s.size());
  for (size_t i = 0, len = 0; i < s.size(); i += len) decompose(data, decode_utf8(s, i, &len), chars);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 1; i < chars.size(); ++i) {
    const uint8_t cc = combining_class(chars[i]);
    if (cc == 0) continue;
    for (size_t j = i; j > 0; --j) {
      const uint8_t prev = combining_class(chars[j - 1]);
      if (prev == 0 || prev <= cc) break;
      std::swap(chars[j - 1], chars[j]);
    }
  }
  // Canonical composition: a char composes with the last starter unless blocked by a char in
  // between of class 0 or >= its own (ordering makes the last one in between the largest).
  std::vector<char32_t> out;
  out.reserve(chars.size());
  size_t starter = SIZE_MAX;
  uint8_t last_cc = 0;
  for (const char32_t c : chars) {
    const uint8_t cc = combining_class(c);
    if (starter != SIZE_MAX) {
      const bool adjacent = out.size() - 1 == starter;
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        if (const char32_t composite = compose(data, out[starter], c)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = out.size();
    last_cc = cc;
    out.push_back(c);
  }
  std::string result;
  result.reserve(s.size());
  for (const char32_t c : out) append_utf8(result, c);
  return result;
}

namespace {

// byte -> code point of the GPT-2 byte-level alphabet; printable Latin-1 bytes map to
// themselves, the others to U+0100.. in byte order.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> from_char{};  // code points used are all < U+0144

  ByteLevelAlphabet() {
    from_char.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      from_char[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return byte_level_alphabet().to_char[b]; }

int byte_from_char(char32_t c) { return c < 0x144 ? byte_level_alphabet().from_char[c] : -1; }

}  // namespace lragent::unicode
