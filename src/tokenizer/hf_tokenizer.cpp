#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace lragent {

HfTokenizer::HfTokenizer(Parts parts) : p_(std::move(parts)) {
  int32_t max_id = p_.model->max_id();
  for (const AddedToken& t : p_.added.tokens()) max_id = std::max(max_id, t.id);
  vocab_size_ = max_id + 1;
}

Result<std::vector<int32_t>> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  // HF only ever sees valid UTF-8 (Python str); other bytes are read as from_utf8_lossy does.
  std::string sanitized;
  if (!unicode::is_valid_utf8(text)) {
    sanitized = unicode::from_utf8_lossy(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  std::vector<AddedVocabulary::Segment> segments;  // [k] raw added tokens and the text between
  p_.added.split(text, /*normalized=*/false, segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      LRA_RETURN_IF_ERROR(encode_piece(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, ids));
    }
  }
  if (add_special_tokens) p_.post.apply(ids);
  return ids;
}

Status HfTokenizer::encode_piece(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const {
  std::string normalized(text);
  if (p_.normalizer) LRA_RETURN_IF_ERROR(p_.normalizer->normalize(normalized));
  std::vector<AddedVocabulary::Segment> segments;  // [k] normalized added tokens and the text between
  p_.added.split(normalized, /*normalized=*/true, segments);
  std::vector<PreToken> words;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    words.clear();
    words.push_back({normalized.substr(seg.begin, seg.end - seg.begin), at_origin && seg.begin == 0});
    if (p_.pre_tokenizer) LRA_RETURN_IF_ERROR(p_.pre_tokenizer->pre_tokenize(words));
    for (const PreToken& w : words) p_.model->tokenize(w.text, ids);
  }
  return Status::Ok();
}

const std::string* HfTokenizer::token_of(int32_t id) const {
  if (const AddedToken* t = p_.added.find_id(id)) return &t->content;
  return p_.model->id_to_token(id);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  // tokens: [k] strings of the known ids; unknown ids are skipped, as HF does.
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (const std::string* t = token_of(id)) tokens.push_back(*t);
  }
  std::string out;
  if (!p_.decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  p_.decoder->decode_chain(tokens);
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  const std::string* t = token_of(id);
  if (t == nullptr) return {};
  std::string bytes = *t;
  if (p_.decoder) p_.decoder->map_token(bytes);
  return bytes;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  const std::string* t = token_of(id);
  return t == nullptr ? std::string() : *t;
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* t = p_.added.find_content(token)) return t->id;
  return p_.model->token_to_id(token);
}

bool HfTokenizer::decode_is_unstable(int32_t id) const {
  const std::string* t = token_of(id);
  return t != nullptr && p_.decoder && p_.decoder->unstable(*t);
}

}  // namespace lragent
