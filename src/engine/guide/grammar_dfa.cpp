#include "engine/guide/grammar_dfa.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace lragent::guide {
namespace {
constexpr int32_t kFailed = -3;  // node() past its bound
}  // namespace

GrammarDfa::GrammarDfa(std::unique_ptr<Grammar> g) : g_(std::move(g)), el_(g_->elements().data()) {
  ++stamp_;
  seen_empty_ = false;
  set_.clear();
  over_ = false;
  for (int32_t a : g_->alternatives(g_->root())) expand(node(a, kEmpty));
  start_ = over_ ? kDead : intern();
}

void GrammarDfa::fail(std::string why) {
  if (exhausted_.empty()) exhausted_ = std::move(why);
}

int32_t GrammarDfa::node(int32_t pos, int32_t below) {
  if (below == kFailed) return kFailed;
  const uint64_t key = (uint64_t{static_cast<uint32_t>(pos)} << 32) | static_cast<uint32_t>(below);
  const auto [it, added] = node_of_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (added) {
    if (nodes_.size() >= kMaxNodes) {
      node_of_.erase(it);
      fail(fmt::format("the grammar's parses nest too deep: their stacks passed {} nodes", kMaxNodes));
      return kFailed;
    }
    nodes_.push_back(Node{pos, below});
  }
  return it->second;
}

void GrammarDfa::expand(int32_t stack) {
  work_.push_back(stack);
  while (!work_.empty()) {
    if (!exhausted_.empty() || over_) {  // past a bound: the transition answers kDead, no need to go on
      work_.clear();
      return;
    }
    const int32_t n = work_.back();
    work_.pop_back();
    if (n == kEmpty) {
      if (!seen_empty_) set_.push_back(kEmpty);
      seen_empty_ = true;
      continue;
    }
    if (n == kFailed) continue;
    const auto k = static_cast<size_t>(n);
    if (k >= seen_.size()) seen_.resize(nodes_.size(), 0);
    if (seen_[k] == stamp_) continue;  // the same parse reached twice (e.g. x* where x may be empty)
    seen_[k] = stamp_;
    const Node nd = nodes_[k];
    const Grammar::Element& e = el_[nd.pos];
    switch (e.kind) {
      case Grammar::Element::kBytes:
        set_.push_back(n);
        if (set_.size() > kMaxStacks) {
          // Only this transition is cut: the mask's walk of a long token (say "((((((((" into a
          // nested rule) must not end the texts that stay under the bound.
          over_ = true;
          if (cut_.empty())
            cut_ = fmt::format("the grammar is too ambiguous: more than {} parses of one text were alive at once "
                               "(let its alternatives differ in their first characters)",
                               kMaxStacks);
        }
        break;
      case Grammar::Element::kEnd:  // the rule is done: back to where it was called from
        work_.push_back(nd.below);
        break;
      case Grammar::Element::kRule: {
        // A call in the last place returns straight to the caller's caller (no frame), which
        // keeps repetitions (x* ::= x x* |) from growing the stack.
        const int32_t ret = nd.pos + 1;
        const int32_t base = el_[ret].kind == Grammar::Element::kEnd ? nd.below : node(ret, nd.below);
        for (int32_t a : g_->alternatives(e.rule)) work_.push_back(node(a, base));
        break;
      }
    }
  }
}

int32_t GrammarDfa::intern() {
  if (!exhausted_.empty() || set_.empty()) return kDead;
  std::sort(set_.begin(), set_.end());
  if (auto it = state_of_.find(set_); it != state_of_.end()) return it->second;
  entries_ += set_.size();
  if (entries_ > kMaxStateEntries) {
    fail(fmt::format("the grammar's automaton grew past {} parse entries", kMaxStateEntries));
    return kDead;
  }
  const auto id = static_cast<int32_t>(states_.size());
  State s;
  s.stacks = &state_of_.emplace(set_, id).first->first;
  s.accepting = set_.front() == kEmpty;
  s.can_continue = set_.back() >= 0;
  states_.push_back(s);
  return id;
}

int32_t GrammarDfa::next_slow(int32_t state, uint8_t byte) {
  if (!exhausted_.empty()) return kDead;
  ++stamp_;
  seen_empty_ = false;
  over_ = false;
  set_.clear();
  // expand() adds nodes but no states, so the set stays where it is.
  for (int32_t n : *states_[static_cast<size_t>(state)].stacks) {
    if (n == kEmpty) continue;
    const Node nd = nodes_[static_cast<size_t>(n)];
    const Grammar::Element& e = el_[nd.pos];
    if (byte >= e.lo && byte <= e.hi) expand(node(nd.pos + 1, nd.below));
  }
  const int32_t t = over_ ? kDead : intern();  // a cut transition is kept as kDead: answers stay the same
  if (!exhausted_.empty()) return kDead;
  State& s = states_[static_cast<size_t>(state)];
  if (s.row < 0) {
    if (row_owner_.size() >= kMaxCachedRows) {  // drop every row at once: no bookkeeping on the fast path
      for (int32_t owner : row_owner_) states_[static_cast<size_t>(owner)].row = -1;
      row_owner_.clear();
      rows_.clear();
    }
    s.row = static_cast<int32_t>(row_owner_.size());
    row_owner_.push_back(state);
    rows_.resize(rows_.size() + 256, kUnknown);
  }
  rows_[static_cast<size_t>(s.row) * 256 + byte] = t;
  return t;
}

}  // namespace lragent::guide
