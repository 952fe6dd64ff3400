// A regular expression compiled to a byte-level DFA built lazily, for structured outputs: the
// engine walks each vocabulary token's bytes through next() to mask the tokens that cannot
// continue a match. The pattern always matches WHOLE byte strings (implicitly anchored at both
// ends), so a state answers "are the bytes so far a match" and "can any continuation match".
//
// Dialect (a common subset of ECMAScript, PCRE and Python `re`):
//   ab  a|b  (a)  (?:a)  (?<name>a)  (?P<name>a)   concatenation, alternation, groups (all
//                                                   groups are just groups: nothing is captured)
//   a* a+ a? a{m} a{m,} a{m,n}   greedy quantifiers, counts <= 1000. A lazy `?` after one is
//                                accepted and changes nothing (the whole string is matched); a
//                                possessive `+` after one is kUnsupported. A `{` that does not
//                                start a valid quantifier is a literal `{` (so is `{,n}`).
//   .            one UTF-8 encoded character other than `\n`. Characters are well-formed UTF-8:
//                1-4 bytes, no overlong forms, no surrogates, at most U+10FFFF.
//   [abc] [a-z] [^...]   one character (code point) in / not in the set; members may be
//                non-ASCII characters and ranges of code points; `]` first is a literal, so is
//                `-` first or last; escapes as below (and `\b` = backspace, as in every flavour).
//                `[:alpha:]`-style POSIX classes are kUnsupported.
//   \d \w \s     ASCII [0-9], [A-Za-z0-9_], [ \t\n\r\f\v]; \D \W \S any character outside them.
//   \n \r \t \f \v \0   control characters; \xHH \uHHHH \u{H...H}: the code point (not the raw
//                byte: \xE9 is é, bytes C3 A9); \uD83D\uDE00 (a surrogate pair) is U+1F600.
//   \ + any ASCII punctuation: that character. Other letter escapes are kInvalidArgument.
//   ^ $          only as the pattern's very first / very last character, where they change
//                nothing; anywhere else kUnsupported.
//   kUnsupported: backreferences (\1..\9, \k<..>, (?P=..)), \b \B \A \z \Z \G \p \P,
//                lookaround ((?= (?! (?<= (?<!), inline flags ((?i) ...), atomic groups,
//                recursion, comments (?#...).
// Literal non-ASCII characters match their UTF-8 bytes. Invalid UTF-8 in the pattern is
// kInvalidArgument. Every error names the byte offset in the pattern and the problem.
//
// Sizes: the NFA is capped at kMaxNfaStates (a pattern needing more, e.g. ((a|b){1000}){100},
// is kInvalidArgument). The DFA is built on demand by subset construction; every NFA set is first
// cut down to the NFA states from which the match state is reachable, so a set that loses them
// all is kDead and kDead is exact: it is returned iff no string with this prefix matches.
//
// The state cap: a DFA state's NFA set and its transition row (256 x int32, 1 KiB) live in a
// cache of at most kMaxCachedStates states and kMaxCachedSetEntries NFA ids over all sets.
// When either would overflow, the whole cache is dropped (at once, not LRU: next()'s fast path
// then needs no bookkeeping) and refilled on demand, so answers never change, only speed.
// State ids are never reused and never invalidated, so a caller may hold ids across any number
// of drops: each id keeps only how it was first reached (its parent id and the byte, 10 bytes
// with its flags and cache slot), and an evicted id's set is rebuilt by replaying that path
// from the nearest cached ancestor or the start (one closure per byte of that path, once per
// evicted id per drop). So memory is bounded except for those 10 bytes per id ever built
// (states()); a set reached again after a drop, by another path, gets a new id.
//
// Not thread-safe: next() mutates the cache; use one ByteDfa per thread (or lock).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace lragent::guide {

namespace detail {
// One NFA state. lo <= hi: consumes one byte in [lo, hi] and goes to `out`. lo > hi: an
// epsilon state going to `out` and `out2` (-1 = no edge). A fragment under construction leaves
// its end state's `out` at -1 until it is linked to what follows.
struct NfaState {
  int32_t out = -1;
  int32_t out2 = -1;
  uint8_t lo = 1;
  uint8_t hi = 0;
};
}  // namespace detail

class ByteDfa {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr size_t kMaxNfaStates = 200000;
  static constexpr size_t kMaxCachedStates = 20000;  // DFA states cached (a set and a row each)
  static constexpr int kMaxRepeat = 1000;             // largest count in {m,n}

  // Compiles `pattern` (the dialect above) to match whole byte strings.
  static Result<std::unique_ptr<ByteDfa>> compile(std::string_view pattern);
  // Not copyable: slot_set_ points into this object's own slot_by_set_.
  ByteDfa(const ByteDfa&) = delete;
  ByteDfa& operator=(const ByteDfa&) = delete;

  // The start state; kDead only when the language is empty (e.g. `[^\s\S]`).
  int32_t start() const { return start_; }

  // The state after `byte`; kDead when no string with this prefix matches; kDead stays kDead.
  // A cached transition is two array loads; otherwise the target is built (next_slow).
  int32_t next(int32_t state, uint8_t byte) {
    if (state < 0) return kDead;
    assert(static_cast<size_t>(state) < slot_of_.size() && "a state id this ByteDfa never returned");
    const int32_t slot = slot_of_[static_cast<size_t>(state)];
    if (slot >= 0) {
      const int32_t t = rows_[static_cast<size_t>(slot) * 256 + byte];
      if (t != kUnknown) return t;
    }
    return next_slow(state, byte);
  }

  // The bytes so far are a whole match.
  bool accepting(int32_t state) const { return state >= 0 && (flags_[static_cast<size_t>(state)] & kAccepting); }
  // Some non-empty continuation leads to a match.
  bool can_continue(int32_t state) const {
    return state >= 0 && (flags_[static_cast<size_t>(state)] & kCanContinue);
  }
  // DFA state ids built so far (ids are 0 .. states()-1); may exceed kMaxCachedStates.
  size_t states() const { return parent_.size(); }

 private:
  static constexpr int32_t kUnknown = -2;  // a row entry not computed yet
  static constexpr uint8_t kAccepting = 1;
  static constexpr uint8_t kCanContinue = 2;
  static constexpr size_t kMaxCachedSetEntries = size_t{1} << 24;  // 64 MiB of NFA ids

  struct SetHash {  // FNV-1a over the NFA ids
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = 0xcbf29ce484222325ull ^ v.size();
      for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull;
      return static_cast<size_t>(h ^ (h >> 29));
    }
  };

  ByteDfa() = default;
  void compute_liveness();
  int32_t next_slow(int32_t state, uint8_t byte);
  // set_ = the epsilon closure of the NFA states in stack_ (consumed), kept to the live states
  // that matter after a closure (byte consumers and match_), sorted.
  void close();
  // set_ = the closure of what the NFA states in set_ reach on `byte`.
  void step(uint8_t byte);
  // The id of set_, or a new id reached from `parent` by `byte`; caches set_ if new.
  int32_t find_or_add(int32_t parent, uint8_t byte);
  // Caches set_ as the set of `id` (dropping the cache first when full); returns the slot.
  int32_t add_slot(int32_t id);
  // Caches an evicted id again, replaying its path; returns its slot.
  int32_t recache(int32_t id);

  std::vector<detail::NfaState> nfa_;  // [n_nfa]
  std::vector<uint8_t> live_;          // [n_nfa] 1 if match_ is reachable from the state
  int32_t nfa_start_ = -1;
  int32_t match_ = -1;
  int32_t start_ = kDead;

  // Per id, kept for the DFA's life [n_ids].
  std::vector<int32_t> parent_;   // the id it was first reached from; -1 for start_
  std::vector<uint8_t> via_;      // the byte it was reached by
  std::vector<uint8_t> flags_;    // kAccepting | kCanContinue
  std::vector<int32_t> slot_of_;  // its cache slot, or -1 when evicted

  // The cache [n_slots]. A DFA state is the sorted set of live NFA states that matter after a
  // closure (byte consumers and match_: epsilon states only lead to those). slot_by_set_ owns
  // each cached set once; slot_set_ points at its key (unordered_map keys never move). An
  // evicted id replayed to a set cached meanwhile under a newer id shares that id's slot.
  std::unordered_map<std::vector<int32_t>, int32_t, SetHash> slot_by_set_;
  std::vector<const std::vector<int32_t>*> slot_set_;  // [n_slots]
  std::vector<int32_t> slot_id_;                       // [n_slots] the id that made the slot
  std::vector<int32_t> rows_;                          // [n_slots, 256] target id, kDead or kUnknown
  std::vector<int32_t> cached_ids_;                    // ids with slot_of_ >= 0, cleared on a drop
  size_t cached_entries_ = 0;                          // sum of the cached sets' sizes

  // Scratch, kept to avoid allocating per transition.
  std::vector<uint32_t> mark_;  // [n_nfa] == stamp_: visited by the current closure
  uint32_t stamp_ = 0;
  std::vector<int32_t> stack_;
  std::vector<int32_t> set_;
  std::vector<int32_t> chain_;  // a replayed path, newest id first
};

}  // namespace lragent::guide
