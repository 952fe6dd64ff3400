// Structured outputs (vLLM's guided decoding, OpenAI's response_format): the tokens a step may
// pick are those whose bytes keep the completion's text a prefix of some string of a language:
// a regular one (a JSON schema, a choice of strings or a regex, each compiled to a regex first:
// json_regex.h) as a byte DFA (byte_dfa.h), or a context-free one (a GBNF grammar, grammar.h) as
// a lazily built automaton over its parse stacks (grammar_dfa.h). Every token of the vocabulary
// is walked through the automaton from the state the text so far reached, in a trie of the
// tokens' bytes so that tokens sharing a prefix share the walk, and the allowed set of each
// state is kept.
//
// One VocabTrie per tokenizer (built once, read-only after), one TokenGuide per request (its DFA
// and masks grow as states are reached), one int32 state per choice (TokenGuide::start, advance).
// Everything but VocabTrie is used from one thread at a time (the engine's).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "engine/guide/byte_dfa.h"
#include "engine/guide/grammar_dfa.h"

namespace lragent {
class Tokenizer;
}

namespace lragent::guide {

// The bytes of every token a guided step may pick, as a trie. Special (added, marked special)
// tokens and tokens with no bytes are left out: they would add text no grammar reads, or nothing.
class VocabTrie {
 public:
  static std::unique_ptr<VocabTrie> build(const Tokenizer& tok);
  int32_t vocab_size() const { return vocab_; }
  size_t nodes() const { return child_begin_.size() - 1; }
  // The bytes token `id` adds ("" for one left out).
  std::string_view bytes(int32_t id) const;

 private:
  friend class TokenGuide;
  int32_t vocab_ = 0;
  // Node i's children are child_byte_/child_node_[child_begin_[i] .. child_begin_[i + 1]) (sorted
  // by byte); the tokens whose bytes end at node i are token_id_[token_begin_[i] .. token_begin_[i + 1]).
  // Node 0 is the root (the empty prefix).
  std::vector<uint32_t> child_begin_;  // [nodes + 1]
  std::vector<uint8_t> child_byte_;    // [edges]
  std::vector<uint32_t> child_node_;   // [edges]
  std::vector<uint32_t> token_begin_;  // [nodes + 1]
  std::vector<int32_t> token_id_;      // [tokens in the trie]
  std::string bytes_;                  // every kept token's bytes, back to back
  std::vector<uint32_t> bytes_begin_;  // [vocab + 1] token id's bytes are bytes_[begin[id] .. begin[id + 1])
};

class TokenGuide {
 public:
  static constexpr int32_t kDead = ByteDfa::kDead;
  // `regex` in ByteDfa's dialect; `vocab` must outlive the guide. Errors: the regex's (ByteDfa::compile),
  // and kInvalidArgument when it matches nothing.
  static Result<std::unique_ptr<TokenGuide>> compile(std::string_view regex, const VocabTrie& vocab);
  // A GBNF grammar (grammar.h) starting at rule `root`. Errors: Grammar::parse's.
  static Result<std::unique_ptr<TokenGuide>> compile_grammar(std::string_view gbnf, std::string_view root,
                                                             const VocabTrie& vocab);

  int32_t start() const { return dfa_ ? dfa_->start() : grammar_->start(); }
  // The state after `token`'s bytes; kDead when they leave the language (or the token is not in
  // the trie: a special token, which only a stop id may be, and that ends the step).
  int32_t advance(int32_t state, int32_t token);
  // The text so far is a whole match: a stop id may end the step here.
  bool accepting(int32_t state) const { return dfa_ ? dfa_->accepting(state) : grammar_->accepting(state); }
  // Some token can extend the text towards a match.
  bool can_continue(int32_t state) const { return dfa_ ? dfa_->can_continue(state) : grammar_->can_continue(state); }
  // Why mask() left no token: a grammar's automaton past its bounds (grammar_dfa.h), or a text
  // the vocabulary cannot continue. For the caller's error.
  std::string dead_end() const {
    if (grammar_ && !grammar_->exhausted().empty()) return grammar_->exhausted();
    std::string why = "no token of the vocabulary continues its text towards a match, and no stop token may end it there";
    if (grammar_ && !grammar_->cut().empty()) why += " (some continuations were cut: " + grammar_->cut() + ")";
    return why;
  }
  // Sets every logit of a token that cannot follow `state` to -inf. `stop_ids` keep theirs only
  // when the state accepts. Returns how many tokens are left (stop ids included).
  int64_t mask(int32_t state, std::span<float> logits, std::span<const int32_t> stop_ids);
  // Tokens allowed from `state` (stop ids aside), for tests and tools.
  const std::vector<uint64_t>& allowed(int32_t state);  // bitset [ceil(vocab / 64)]
  size_t dfa_states() const { return dfa_ ? dfa_->states() : grammar_->states(); }

 private:
  TokenGuide() = default;
  template <typename Automaton>
  int32_t advance_in(Automaton& a, int32_t state, int32_t token);
  template <typename Automaton>
  void walk(Automaton& a, int32_t state, std::vector<uint64_t>& bits);
  // Exactly one of the two.
  std::unique_ptr<ByteDfa> dfa_;
  std::unique_ptr<GrammarDfa> grammar_;
  const VocabTrie* vocab_ = nullptr;
  // Allowed-token bitsets of the states reached so far. Bounded (kMaxMasks): a guide that
  // wanders through more states recomputes the ones it drops.
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;
  static constexpr size_t kMaxMasks = 256;
};

}  // namespace lragent::guide
