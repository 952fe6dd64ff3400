// A grammar (grammar.h) as a deterministic automaton over bytes, built lazily, with ByteDfa's
// interface so that TokenGuide walks the vocabulary through either. A state is the set of every
// parse the bytes so far allow, each a stack of grammar positions (the top: the element to read
// next; below it, where each rule called returns to), as llama.cpp's grammar matcher keeps it.
// Stacks are interned as linked nodes (position, the node below), so parses share their bottoms
// and a set of stacks is a sorted list of node ids; equal sets get one state id.
//
// Every stack in a set has a byte range on top (rule references are expanded, finished rules
// popped, as a byte is read), or is empty (a whole match). Grammar::parse refused what would make
// that expansion endless (left recursion) and rules that never finish, so a non-empty set can
// always reach a whole match: kDead is exact, as for ByteDfa.
//
// Bounds: a set holds at most kMaxStacks parses (an ambiguous grammar can multiply them): a
// transition to a bigger one answers kDead, that one only, and cut() says why. The automaton
// holds at most kMaxNodes stack nodes and kMaxStateEntries node ids over all its sets: past
// either, every new transition answers kDead and exhausted() says why. A guided request ends
// with that error instead of using unbounded memory. Transition rows (256 x int32 each) are a cache of at
// most kMaxCachedRows, dropped whole when full and refilled on demand.
//
// Not thread-safe: next() mutates the automaton; one per request (TokenGuide), as ByteDfa.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/guide/grammar.h"

namespace lragent::guide {

class GrammarDfa {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr size_t kMaxStacks = 4096;
  static constexpr size_t kMaxNodes = size_t{1} << 22;
  static constexpr size_t kMaxStateEntries = size_t{1} << 22;
  static constexpr size_t kMaxCachedRows = 16384;

  explicit GrammarDfa(std::unique_ptr<Grammar> g);
  GrammarDfa(const GrammarDfa&) = delete;
  GrammarDfa& operator=(const GrammarDfa&) = delete;

  int32_t start() const { return start_; }
  // The state after `byte`; kDead when no text of the grammar starts with these bytes (or a
  // bound was hit: exhausted()). kDead stays kDead.
  int32_t next(int32_t state, uint8_t byte) {
    if (state < 0) return kDead;
    assert(static_cast<size_t>(state) < states_.size() && "a state id this GrammarDfa never returned");
    const int32_t row = states_[static_cast<size_t>(state)].row;
    if (row >= 0) {
      const int32_t t = rows_[static_cast<size_t>(row) * 256 + byte];
      if (t != kUnknown) return t;
    }
    return next_slow(state, byte);
  }
  bool accepting(int32_t state) const { return state >= 0 && states_[static_cast<size_t>(state)].accepting; }
  bool can_continue(int32_t state) const { return state >= 0 && states_[static_cast<size_t>(state)].can_continue; }
  size_t states() const { return states_.size(); }
  size_t nodes() const { return nodes_.size(); }
  // Why the automaton stopped answering; empty while it has not.
  const std::string& exhausted() const { return exhausted_; }
  // Why some transition answered kDead where the language goes on (too many parses at once);
  // empty while none did. The other transitions are not affected.
  const std::string& cut() const { return cut_; }
  const Grammar& grammar() const { return *g_; }

 private:
  static constexpr int32_t kUnknown = -2;  // a row entry not computed yet
  static constexpr int32_t kEmpty = -1;    // the empty stack (a whole match) in a set

  struct Node {
    int32_t pos;    // an element of the grammar
    int32_t below;  // the node under it, or kEmpty
  };
  struct State {
    // Sorted node ids (kEmpty first when present): the key of state_of_, which owns it (map keys
    // never move), so each set is kept once.
    const std::vector<int32_t>* stacks = nullptr;
    int32_t row = -1;             // its transition row in rows_, or -1
    bool accepting = false;
    bool can_continue = false;
  };
  struct SetHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = 0xcbf29ce484222325ull ^ v.size();
      for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull;
      return static_cast<size_t>(h ^ (h >> 29));
    }
  };

  int32_t next_slow(int32_t state, uint8_t byte);
  int32_t node(int32_t pos, int32_t below);
  // Adds `stack` to set_, expanded until every stack has a byte range on top or is empty.
  void expand(int32_t stack);
  // The state of set_ (sorted, unique), new or found; kDead when empty or exhausted.
  int32_t intern();
  void fail(std::string why);

  std::unique_ptr<Grammar> g_;
  const Grammar::Element* el_ = nullptr;  // g_->elements().data()
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_of_;  // (pos, below) -> node id
  std::vector<State> states_;
  std::unordered_map<std::vector<int32_t>, int32_t, SetHash> state_of_;
  size_t entries_ = 0;  // node ids over all sets
  std::vector<int32_t> rows_;  // [cached rows, 256] target state, kDead or kUnknown
  std::vector<int32_t> row_owner_;  // [cached rows] the state each row belongs to
  int32_t start_ = kDead;
  std::string exhausted_;
  std::string cut_;

  // Scratch for expand(), kept to avoid allocating per transition.
  std::vector<int32_t> set_;
  std::vector<int32_t> work_;
  std::vector<uint32_t> seen_;  // [nodes] == stamp_: expanded by the current transition
  uint32_t stamp_ = 0;
  bool seen_empty_ = false;
  bool over_ = false;  // the current transition's set passed kMaxStacks
};

}  // namespace lragent::guide
