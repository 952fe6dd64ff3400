// tokenizer.json "added_tokens": tokens matched in the text before the model runs (HF
// AddedVocabulary). Tokens with normalized == false are found in the raw text; the others in
// the normalized text, by their normalized form. Matching is leftmost-longest like HF's
// Aho-Corasick, with the lstrip / rstrip / single_word options applied afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "tokenizer/bpe.h"

namespace lragent {

class Normalizer;
class Regex;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

class AddedVocabulary {
 public:
  // A piece of text: plain (id == -1) or one added token (which may include stripped spaces).
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;
  };

  // `normalizer` (may be null) gives the form normalized tokens are matched in.
  AddedVocabulary();
  ~AddedVocabulary();
  AddedVocabulary(AddedVocabulary&&) noexcept;
  AddedVocabulary& operator=(AddedVocabulary&&) noexcept;

  static Result<AddedVocabulary> build(std::vector<AddedToken> tokens, const Normalizer* normalizer,
                                       std::string_view where);

  // Covers `text` with segments in order. `normalized` picks which tokens are looked for.
  // out: [k] segments; plain ones are never empty.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_id(int32_t id) const;               // nullptr if no added token has it
  const AddedToken* find_content(std::string_view s) const;  // nullptr if none

 private:
  // Byte trie over token contents for leftmost-longest matching.
  class Trie {
   public:
    void insert(std::string_view pattern, int32_t token_index);
    bool empty() const { return node_token_.size() <= 1; }
    // Longest pattern that starts at text[pos]: its token index and length, or -1.
    int32_t longest_at(std::string_view text, size_t pos, size_t* len) const;
    bool may_start(unsigned char c) const { return first_bytes_[c]; }

   private:
    std::vector<int32_t> node_token_{-1};          // [nodes] token index ending at the node, or -1; 0 = root
    std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
    bool first_bytes_[256] = {};
  };

  bool is_word_char_at(std::string_view text, size_t pos, bool before) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;  // id -> index in tokens_
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> by_content_;
  Trie raw_trie_;
  Trie normalized_trie_;
  std::unique_ptr<Regex> word_char_;  // Rust's Unicode \w; only built when a token is single_word
};

}  // namespace lragent
