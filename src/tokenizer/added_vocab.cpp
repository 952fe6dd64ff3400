#include "tokenizer/added_vocab.h"

#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace lragent {

AddedVocabulary::AddedVocabulary() = default;
AddedVocabulary::~AddedVocabulary() = default;
AddedVocabulary::AddedVocabulary(AddedVocabulary&&) noexcept = default;
AddedVocabulary& AddedVocabulary::operator=(AddedVocabulary&&) noexcept = default;

void AddedVocabulary::Trie::insert(std::string_view pattern, int32_t token_index) {
  int32_t node = 0;
  for (const char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    const auto it = edges_.find(key);
    if (it != edges_.end()) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(node_token_.size());
      node_token_.push_back(-1);
      edges_.emplace(key, child);
      node = child;
    }
  }
  first_bytes_[static_cast<uint8_t>(pattern[0])] = true;
  // With duplicate contents the first token wins, like HF's pattern order.
  if (node_token_[node] < 0) node_token_[node] = token_index;
}

int32_t AddedVocabulary::Trie::longest_at(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (node_token_[node] >= 0) {
      best = node_token_[node];
      *len = i + 1 - pos;
    }
  }
  return best;
}

Result<AddedVocabulary> AddedVocabulary::build(std::vector<AddedToken> tokens, const Normalizer* normalizer,
                                               std::string_view where) {
  AddedVocabulary v;
  v.tokens_ = std::move(tokens);
  bool any_single_word = false;
  // HF builds its matchers from the special tokens first, then the others.
  for (const bool special : {true, false}) {
    for (size_t i = 0; i < v.tokens_.size(); ++i) {
      const AddedToken& t = v.tokens_[i];
      if (t.special != special || t.content.empty()) continue;
      v.by_id_.emplace(t.id, i);
      v.by_content_.emplace(t.content, i);
      any_single_word = any_single_word || t.single_word;
      if (!t.normalized) {
        v.raw_trie_.insert(t.content, static_cast<int32_t>(i));
        continue;
      }
      std::string pattern = t.content;
      if (normalizer != nullptr) LRA_RETURN_IF_ERROR(normalizer->normalize(pattern));
      if (!pattern.empty()) v.normalized_trie_.insert(pattern, static_cast<int32_t>(i));
    }
  }
  if (any_single_word) {
    // Rust regex's Unicode \w: Alphabetic (letters, letter numbers, most marks), marks,
    // decimal digits, connector punctuation, ZWNJ/ZWJ.
    LRA_ASSIGN_OR_RETURN(v.word_char_, Regex::compile(R"(\A[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", where));
  }
  return v;
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find_content(std::string_view s) const {
  const auto it = by_content_.find(s);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

bool AddedVocabulary::is_word_char_at(std::string_view text, size_t pos, bool before) const {
  size_t begin = pos;
  if (before) {
    if (pos == 0) return false;
    do {
      --begin;
    } while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80);
  } else if (pos >= text.size()) {
    return false;
  }
  const size_t len = unicode::utf8_length(static_cast<uint8_t>(text[begin]));
  return word_char_->search(text.substr(begin, len));
}

void AddedVocabulary::split(std::string_view text, bool normalized, std::vector<Segment>& out) const {
  out.clear();
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  size_t start_offset = 0;  // end of the last segment emitted
  if (!trie.empty()) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t len = 0;
      const int32_t index = trie.may_start(static_cast<uint8_t>(text[pos])) ? trie.longest_at(text, pos, &len) : -1;
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken& t = tokens_[index];
      size_t start = pos, stop = pos + len;
      pos = stop;  // the next search starts after this match even if the match is discarded
      if (t.single_word && (is_word_char_at(text, start, true) || is_word_char_at(text, stop, false))) continue;
      if (t.lstrip) {
        // Take in the whitespace before the token, but not into the previous segment.
        size_t s = start;
        while (s > start_offset) {
          size_t b = s - 1;
          while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
          size_t clen = 0;
          if (!unicode::is_white_space(unicode::decode_utf8(text, b, &clen))) break;
          s = b;
        }
        start = s;
      }
      if (t.rstrip) {
        while (stop < text.size()) {
          size_t clen = 0;
          if (!unicode::is_white_space(unicode::decode_utf8(text, stop, &clen))) break;
          stop += clen;
        }
      }
      if (start_offset < start) out.push_back({start_offset, start, -1});
      out.push_back({start, stop, t.id});
      start_offset = stop;
    }
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace lragent
