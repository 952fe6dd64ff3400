// The Tokenizer behind Tokenizer::from_json: HF's pipeline of added tokens, normalizer,
// pre-tokenizer, BPE model, post-processor and decoder, each built from tokenizer.json.
#pragma once

#include <memory>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/postprocessor.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace lragent {

class HfTokenizer final : public Tokenizer {
 public:
  struct Parts {
    std::unique_ptr<BpeModel> model;
    std::unique_ptr<Normalizer> normalizer;       // null: text is used as is
    std::unique_ptr<PreTokenizer> pre_tokenizer;  // null: each piece is one word
    std::unique_ptr<Decoder> decoder;             // null: tokens are joined with spaces
    AddedVocabulary added;
    PostProcessor post;
    int32_t bos = -1;
    int32_t eos = -1;
  };
  explicit HfTokenizer(Parts parts);

  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id) const override;
  std::string id_to_token(int32_t id) const override;
  int32_t token_to_id(std::string_view token) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return p_.bos; }
  int32_t eos_id() const override { return p_.eos; }
  bool decode_is_unstable(int32_t id) const override;
  bool is_special(int32_t id) const override {
    const AddedToken* t = p_.added.find_id(id);
    return t != nullptr && t->special;
  }

 private:
  // Token string of `id` as decode() sees it (added tokens first), or null.
  const std::string* token_of(int32_t id) const;
  // Normalizes, splits and tokenizes text that holds no raw added token.
  Status encode_piece(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const;

  Parts p_;
  int32_t vocab_size_;  // max id + 1 over the model vocab and added tokens
};

}  // namespace lragent
