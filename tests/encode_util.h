// Tokenizer::encode for tests whose text must encode: an encode error fails the test, naming the
// text's start and the error, and gives no ids (so the comparison that follows fails too).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"

namespace lragent::testing {

inline std::vector<int32_t> must_encode(const Tokenizer& tok, std::string_view text, bool add_special_tokens = true) {
  auto ids = tok.encode(text, add_special_tokens);
  if (!ids.ok()) {
    ADD_FAILURE() << "encode(\"" << text.substr(0, 40) << "...\") failed: " << ids.error().message;
    return {};
  }
  return std::move(*ids);
}

}  // namespace lragent::testing
