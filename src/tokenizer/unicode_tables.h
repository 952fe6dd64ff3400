// Raw Unicode data behind unicode::nfc(), generated into unicode_tables.cpp.
#pragma once

#include <cstdint>
#include <span>

namespace lragent::unicode {

// One canonical (non-compatibility) decomposition step: cp -> first [second].
struct CanonicalDecomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;    // 0 for a singleton decomposition
  uint32_t composes;  // 1 if NFC recomposes first+second into cp (not a composition exclusion)
};

// Code points lo..hi (inclusive) share canonical combining class ccc (never 0 here).
struct CombiningClassRange {
  uint32_t lo;
  uint32_t hi;
  uint32_t ccc;
};

// Sorted by cp / lo. Hangul syllables are absent: they are handled arithmetically.
std::span<const CanonicalDecomposition> canonical_decompositions();
std::span<const CombiningClassRange> combining_class_ranges();

}  // namespace lragent::unicode
