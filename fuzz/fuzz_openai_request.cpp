// libFuzzer target: arbitrary bytes as the body of POST /v1/completions. The parser must return
// a request or an error (never crash or throw), and what it accepts must hold the invariants the
// server relies on.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto r = lragent::server::parse_completion_request(text);
  if (!r.ok()) {
    if (r.error().message.empty()) __builtin_trap();
    // The error body is valid JSON text whatever the message holds.
    const std::string body =
        lragent::server::error_json(r.error()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (body.empty() || lragent::server::http_status(r.error().code) != 400) __builtin_trap();
    return 0;
  }
  const auto& q = *r;
  if (q.prompts.empty() || q.n < 1 || q.max_tokens < 0) __builtin_trap();
  for (const auto& p : q.prompts)
    if (p.is_tokens && (p.tokens.empty() || *std::min_element(p.tokens.begin(), p.tokens.end()) < 0)) __builtin_trap();
  for (const auto& s : q.stop)
    if (s.empty()) __builtin_trap();
  if (!std::isfinite(q.sampling.temperature) || q.sampling.temperature < 0) __builtin_trap();
  if (!(q.sampling.top_p > 0 && q.sampling.top_p <= 1) || q.sampling.top_k < 0) __builtin_trap();
  if (q.include_usage && !q.stream) __builtin_trap();
  if (!(q.penalties.repetition > 0) || !std::isfinite(q.penalties.frequency) || !std::isfinite(q.penalties.presence))
    __builtin_trap();
  if (q.max_tokens == 0 && !q.echo) __builtin_trap();
  return 0;
}
