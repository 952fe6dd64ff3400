#include "engine/guide/token_guide.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "tokenizer/tokenizer.h"

namespace lragent::guide {

std::unique_ptr<VocabTrie> VocabTrie::build(const Tokenizer& tok) {
  auto t = std::make_unique<VocabTrie>();
  t->vocab_ = tok.vocab_size();
  t->bytes_begin_.assign(static_cast<size_t>(t->vocab_) + 1, 0);
  for (int32_t id = 0; id < t->vocab_; ++id) {
    t->bytes_begin_[static_cast<size_t>(id)] = static_cast<uint32_t>(t->bytes_.size());
    if (tok.is_special(id)) continue;
    t->bytes_ += tok.token_bytes(id);
  }
  t->bytes_begin_.back() = static_cast<uint32_t>(t->bytes_.size());
  // The tokens sorted by their bytes: a node is then a run of tokens sharing a prefix, and the
  // trie comes out depth first with every node's children in byte order.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < t->vocab_; ++id)
    if (!t->bytes(id).empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string_view x = t->bytes(a), y = t->bytes(b);
    return x != y ? x < y : a < b;
  });
  // Built with per-node child lists, then flattened.
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    std::vector<int32_t> tokens;
  };
  std::vector<Node> nodes(1);
  for (int32_t id : order) {
    uint32_t n = 0;
    for (unsigned char b : t->bytes(id)) {
      auto& ch = nodes[n].children;
      // Sorted insertion order makes a new child always the last one.
      if (ch.empty() || ch.back().first != b) {
        ch.emplace_back(b, static_cast<uint32_t>(nodes.size()));
        nodes.emplace_back();
      }
      n = nodes[n].children.back().second;
    }
    nodes[n].tokens.push_back(id);
  }
  t->child_begin_.reserve(nodes.size() + 1);
  t->token_begin_.reserve(nodes.size() + 1);
  for (const Node& nd : nodes) {
    t->child_begin_.push_back(static_cast<uint32_t>(t->child_byte_.size()));
    t->token_begin_.push_back(static_cast<uint32_t>(t->token_id_.size()));
    for (auto [b, c] : nd.children) {
      t->child_byte_.push_back(b);
      t->child_node_.push_back(c);
    }
    t->token_id_.insert(t->token_id_.end(), nd.tokens.begin(), nd.tokens.end());
  }
  t->child_begin_.push_back(static_cast<uint32_t>(t->child_byte_.size()));
  t->token_begin_.push_back(static_cast<uint32_t>(t->token_id_.size()));
  return t;
}

std::string_view VocabTrie::bytes(int32_t id) const {
  if (id < 0 || id >= vocab_) return {};
  const auto k = static_cast<size_t>(id);
  return std::string_view(bytes_).substr(bytes_begin_[k], bytes_begin_[k + 1] - bytes_begin_[k]);
}

Result<std::unique_ptr<TokenGuide>> TokenGuide::compile(std::string_view regex, const VocabTrie& vocab) {
  std::unique_ptr<TokenGuide> g(new TokenGuide());
  LRA_ASSIGN_OR_RETURN(g->dfa_, ByteDfa::compile(regex));
  if (g->dfa_->start() == kDead) return make_error(ErrorCode::kInvalidArgument, "the pattern matches no text at all");
  g->vocab_ = &vocab;
  return g;
}

Result<std::unique_ptr<TokenGuide>> TokenGuide::compile_grammar(std::string_view gbnf, std::string_view root,
                                                               const VocabTrie& vocab) {
  std::unique_ptr<TokenGuide> g(new TokenGuide());
  LRA_ASSIGN_OR_RETURN(std::unique_ptr<Grammar> grammar, Grammar::parse(gbnf, root));
  g->grammar_ = std::make_unique<GrammarDfa>(std::move(grammar));
  // Grammar::parse refused a start rule that never finishes, so the start state is alive unless
  // its parses alone pass the automaton's bound.
  if (g->grammar_->start() == kDead)
    return make_error(ErrorCode::kInvalidArgument, "the grammar cannot be followed: {}",
                      g->grammar_->cut().empty() ? std::string("it matches no text at all") : g->grammar_->cut());
  g->vocab_ = &vocab;
  return g;
}

template <typename Automaton>
int32_t TokenGuide::advance_in(Automaton& a, int32_t state, int32_t token) {
  const std::string_view b = vocab_->bytes(token);
  if (b.empty()) return kDead;
  for (unsigned char c : b) {
    state = a.next(state, c);
    if (state == kDead) return kDead;
  }
  return state;
}

int32_t TokenGuide::advance(int32_t state, int32_t token) {
  return dfa_ ? advance_in(*dfa_, state, token) : advance_in(*grammar_, state, token);
}

const std::vector<uint64_t>& TokenGuide::allowed(int32_t state) {
  if (auto it = masks_.find(state); it != masks_.end()) return it->second;
  if (masks_.size() >= kMaxMasks) masks_.clear();  // the states a guide keeps coming back to come back
  std::vector<uint64_t>& bits = masks_[state];
  bits.assign((static_cast<size_t>(vocab_->vocab_) + 63) / 64, 0);
  if (state == kDead) return bits;
  if (dfa_) walk(*dfa_, state, bits);
  else walk(*grammar_, state, bits);
  return bits;
}

template <typename Automaton>
void TokenGuide::walk(Automaton& a, int32_t state, std::vector<uint64_t>& bits) {
  const VocabTrie& v = *vocab_;
  // Depth first over the trie, each node with the DFA state its bytes lead to; a dead state
  // prunes the node's whole subtree (every token that starts with those bytes).
  std::vector<std::pair<uint32_t, int32_t>> stack{{0u, state}};  // (node, DFA state after its bytes)
  while (!stack.empty()) {
    const auto [node, s] = stack.back();
    stack.pop_back();
    for (uint32_t e = v.child_begin_[node]; e < v.child_begin_[node + 1]; ++e) {
      const int32_t s2 = a.next(s, v.child_byte_[e]);
      if (s2 == kDead) continue;
      const uint32_t c = v.child_node_[e];
      for (uint32_t k = v.token_begin_[c]; k < v.token_begin_[c + 1]; ++k) {
        const auto id = static_cast<uint32_t>(v.token_id_[k]);
        bits[id / 64] |= uint64_t{1} << (id % 64);
      }
      stack.emplace_back(c, s2);
    }
  }
}

int64_t TokenGuide::mask(int32_t state, std::span<float> logits, std::span<const int32_t> stop_ids) {
  const std::vector<uint64_t>& bits = allowed(state);
  const bool may_stop = state != kDead && accepting(state);
  // The stop ids' own logits: they may end the step where the text is a whole match, whatever
  // their bytes (special tokens are not in the trie).
  std::vector<std::pair<size_t, float>> stops;
  for (int32_t id : stop_ids)
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) stops.emplace_back(static_cast<size_t>(id), logits[static_cast<size_t>(id)]);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t id = 0; id < logits.size(); ++id)
    if (id / 64 >= bits.size() || !(bits[id / 64] >> (id % 64) & 1)) logits[id] = neg_inf;
  for (auto [id, v] : stops) logits[id] = may_stop ? v : neg_inf;
  int64_t left = 0;
  for (float x : logits) left += x != neg_inf ? 1 : 0;
  return left;
}

}  // namespace lragent::guide
