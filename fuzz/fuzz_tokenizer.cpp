// libFuzzer target: arbitrary bytes as tokenizer.json. Loading must return an error naming its
// source or a tokenizer; a loaded tokenizer must encode a short text (and the first bytes of the
// input, which are often invalid UTF-8) or fail naming its source, without crashing; the ids must
// decode to valid UTF-8 and stream-decode to exactly what decode() gives.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void exercise(const lragent::Tokenizer& tok, std::string_view text, const std::string& source) {
  auto encoded = tok.encode(text);
  if (!encoded.ok()) {
    // Only a regex that gives up on the text may fail an encode, and it names its pattern.
    check(encoded.error().code == lragent::ErrorCode::kInvalidArgument);
    check(encoded.error().message.rfind(source, 0) == 0);
    return;
  }
  const std::vector<int32_t>& ids = *encoded;
  const std::string decoded = tok.decode(ids);
  check(lragent::unicode::is_valid_utf8(decoded));
  lragent::StreamDecoder stream(tok);
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.push(id);
  check(streamed + stream.finish() == decoded);
  for (const int32_t id : ids) (void)tok.token_bytes(id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source = "<fuzz>";
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (const auto flavor : {lragent::TokenizerFlavor::kTokenizers, lragent::TokenizerFlavor::kTransformers}) {
    auto tok = lragent::Tokenizer::from_json(input, R"({"tokenizer_class": "LlamaTokenizer", "add_bos_token": true})",
                                             source, flavor);
    if (!tok.ok()) {
      check(tok.error().message.rfind(source, 0) == 0);  // every error names its file
      continue;
    }
    exercise(**tok, "Hello  wo\xCC\x81rld! <s> ab-c\t\xE4\xB8\xAD\xF0\x9F\x98\x80 12345 'll", source);
    exercise(**tok, input.substr(0, 64), source);
  }
  return 0;
}
