// libFuzzer target: structured outputs' two parsers, on untrusted request text. The first byte
// picks one:
//   even: the rest is a regex (engine/guide/byte_dfa.h's dialect; up to its first NUL) and the
//         bytes after that NUL are walked through its DFA;
//   odd:  the rest is a JSON schema; what json_schema_regex makes of it must compile as a regex
//         (the converter only emits its dialect) and its DFA is walked over a few bytes.
// Every input must give a value or an error, never a crash, a throw or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/guide/byte_dfa.h"
#include "engine/guide/json_regex.h"

namespace {

void walk(lragent::guide::ByteDfa& dfa, std::string_view input) {
  int32_t s = dfa.start();
  for (unsigned char c : input) {
    s = dfa.next(s, c);
    if (s == lragent::guide::ByteDfa::kDead) return;
    (void)dfa.accepting(s);
    (void)dfa.can_continue(s);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    const size_t nul = rest.find('\0');
    auto dfa = lragent::guide::ByteDfa::compile(rest.substr(0, nul));
    if (dfa.ok()) walk(**dfa, nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1));
    return 0;
  }
  const nlohmann::json schema = nlohmann::json::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  lragent::guide::JsonRegexOptions o;
  o.max_depth = 2;
  auto re = lragent::guide::json_schema_regex(schema, o);
  if (!re.ok()) return 0;
  auto dfa = lragent::guide::ByteDfa::compile(*re);
  // The converter's regex not compiling is its bug (the request would fail at the server instead
  // of at parsing): let the fuzzer see it. Too large or nested too deep are the honest refusals.
  if (!dfa.ok() && dfa.error().message.find("too large") == std::string::npos &&
      dfa.error().message.find("nested deeper") == std::string::npos)
    std::abort();
  if (dfa.ok()) walk(**dfa, R"({"a": [1, 2.5e3, "x\u00e9", true, null]})");
  return 0;
}
