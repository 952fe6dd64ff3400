// UTF-8 byte ranges of code point sets (utf8_ranges.h).
#include "engine/guide/utf8_ranges.h"

#include <algorithm>

namespace lragent::guide {

// The length of the well-formed UTF-8 character at s[pos] (its code point in *cp), or 0.
// Well-formed per Unicode table 3-7: only the second byte's range depends on the first, which
// is what rules out overlong forms (E0 80.., F0 80..), surrogates (ED A0..) and > U+10FFFF.
int utf8_char(std::string_view s, size_t pos, uint32_t* cp) {
  const uint8_t b0 = static_cast<uint8_t>(s[pos]);
  int n = 1;
  uint8_t payload = 0x7F, lo = 0x80, hi = 0xBF;  // the lead byte's value bits; the 2nd byte's range
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, payload = 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, payload = 0x0F, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, payload = 0x07, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
  } else if (b0 >= 0x80) {
    return 0;
  }
  if (pos + n > s.size()) return 0;
  uint32_t v = b0 & payload;
  for (int i = 1; i < n; ++i) {
    const uint8_t c = static_cast<uint8_t>(s[pos + i]);
    if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xBF)) return 0;
    v = (v << 6) | (c & 0x3F);
  }
  *cp = v;
  return n;
}

// Encodes a code point (not a surrogate, <= U+10FFFF) into out[0..4); returns the length.
int utf8_encode(uint32_t cp, uint8_t* out) {
  const int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};  // [n]: the lead byte's length marker
  for (int i = n - 1; i > 0; --i, cp >>= 6) out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
  return n;
}

// Appends the byte-range sequences matching exactly the UTF-8 encodings of [lo, hi]. A range is
// split until every code point in it has the same length and the range is a product of byte
// ranges: at each continuation level, a range whose low end is not aligned to a block of 64^i
// code points (or whose high end does not close one) is cut at that block boundary.
void utf8_seqs(uint32_t lo, uint32_t hi, std::vector<Seq>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not characters
    if (lo < 0xD800) utf8_seqs(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_seqs(0xE000, hi, out);
    return;
  }
  const auto split = [&](uint32_t last) {  // [lo, last] and [last + 1, hi]
    utf8_seqs(lo, last, out);
    utf8_seqs(last + 1, hi, out);
  };
  for (uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // the last code point of each length
    if (lo <= bound && hi > bound) return split(bound);
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) return split(lo | m);
    if ((hi & m) != m) return split((hi & ~m) - 1);
  }
  Seq s;
  s.n = utf8_encode(lo, s.lo.data());
  utf8_encode(hi, s.hi.data());
  out.push_back(s);
}

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& [lo, hi] : r) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  return merged;
}

// Every code point (surrogates included; utf8_seqs drops them) outside r.
Ranges negate(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

std::vector<Seq> class_seqs(const Ranges& set) {
  std::vector<Seq> seqs;
  for (const auto& [lo, hi] : normalize(set)) utf8_seqs(lo, std::min(hi, kMaxCodePoint), seqs);
  return seqs;
}

}  // namespace lragent::guide
