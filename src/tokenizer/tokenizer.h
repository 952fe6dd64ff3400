// Tokenizer loaded from a Hugging Face tokenizer.json (+ tokenizer_config.json when present).
// Supports the two BPE families used by Llama-style models:
//  * SentencePiece-style BPE: Metaspace pre-tokenizer or Prepend/Replace normalizer, byte
//    fallback (<0xNN> tokens) -- TinyStories, Llama-2, Mistral;
//  * byte-level BPE with a regex Split pre-tokenizer (PCRE2) and ByteLevel mapping -- Llama-3, Qwen.
// Added/special tokens are matched in the raw text before the model runs, as HF does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent {

// Which Hugging Face entry point the ids reproduce. They differ where transformers rebuilds the
// pipeline from tokenizer_config.json instead of reading tokenizer.json as is.
enum class TokenizerFlavor {
  // transformers 5 `AutoTokenizer`: add_bos_token / add_eos_token in the config rebuild the
  // post-processor, and a LlamaTokenizer config gets transformers' own Llama pipeline
  // (Metaspace pre-tokenizer, no normalizer, no unk: unknown characters without byte pieces
  // are dropped). See docs/tokenizer.md.
  kTransformers,
  // The `tokenizers` library: tokenizer.json as is; the config only names BOS/EOS.
  kTokenizers,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json (add_bos_token,
  // add_eos_token, bos/eos token strings).
  static Result<std::unique_ptr<Tokenizer>> load_dir(const std::string& dir,
                                                     TokenizerFlavor flavor = TokenizerFlavor::kTransformers);
  // From the text of tokenizer.json (and optionally tokenizer_config.json, may be empty).
  // `source` names the file in errors.
  static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view tokenizer_json,
                                                      std::string_view tokenizer_config_json,
                                                      const std::string& source,
                                                      TokenizerFlavor flavor = TokenizerFlavor::kTransformers);

  // Same ids as HF `tokenizer(text)["input_ids"]` (i.e. encode with add_special_tokens=True:
  // the post-processor's BOS/EOS are added as the HF tokenizer would). Fails (kInvalidArgument,
  // naming the pattern) only where a normalizer or pre-tokenizer regex gives up on the text:
  // the ids would otherwise differ from HF's without a word.
  virtual Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // Same text as HF `tokenizer.decode(ids)` (skip_special_tokens=False).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Raw bytes that a single token contributes (after byte-fallback / byte-level mapping);
  // SentencePiece's leading-space stripping at the sequence start is NOT applied here.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;  // vocab string, "" if out of range
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 if unknown
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  // Whether decode() may still render this token differently once more ids follow it
  // (a ByteFallback <0xNN> piece joins the byte run after it); StreamDecoder waits on such ids.
  virtual bool decode_is_unstable(int32_t id) const { return false; }
  // Whether `id` is an added token marked special (HF's skip_special_tokens drops these).
  virtual bool is_special(int32_t id) const { return false; }
};

// Incremental detokenizer for streaming output: push ids, get only complete UTF-8 text.
// Concatenating all outputs of push() plus finish() equals tokenizer.decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);
  std::string finish();  // flushes whatever is left (invalid UTF-8 as U+FFFD, as HF does)
  // Decodes what follows in the context of `id` (e.g. a prompt's last token), whose own text is
  // not returned: first-token rules such as stripping a leading space then do not apply, as
  // vLLM's detokenizer decodes a completion after its prompt. Before the first push() only;
  // an id without bytes (most special tokens) gives no context and is ignored.
  void prime(int32_t id);

 private:
  const Tokenizer& tok_;
  // The ids decoded together: the last id of an already emitted, cleanly ending prefix (as
  // context, so first-token rules such as stripping a leading space are not re-applied),
  // then the ids whose text is not fully returned yet.
  std::vector<int32_t> ids_;
  size_t emitted_ = 0;  // bytes of decode(ids_) already returned (or covered by the context)
};

}  // namespace lragent
