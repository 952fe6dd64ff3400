// tokenizer.json "decoder": turns the token strings of a sequence back into text (HF decoders).
// Supported: Sequence, Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF decode_chain: rewrites the list of token strings; decode() is the concatenation.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // The raw bytes one token stands for on its own, away from the start of a sequence
  // (Tokenizer::token_bytes): per-token mappings only, no fusing or stripping.
  virtual void map_token(std::string& token) const = 0;
  // Whether decoding is not prefix-stable around `token` (StreamDecoder must wait for later
  // tokens): a ByteFallback <0xNN> piece joins the byte run after it, and a Strip that trims
  // the end or more than one leading character affects text already seen.
  virtual bool unstable(const std::string& token) const = 0;

  // `j` must not be null (a null decoder means "join with spaces" and is handled by the caller).
  static Result<std::unique_ptr<Decoder>> from_json(const nlohmann::json& j, std::string_view where);
};

}  // namespace lragent
