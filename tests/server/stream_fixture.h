// Feeds a model's text to an API's event builder (ResponseBuilder, MessageBuilder) as a stream
// does: through a ChatStream a few bytes at a time, each piece's content and tool-call deltas
// handed on, then what the splitter held back.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace lragent::testing {

// `out` pushed `piece` bytes at a time; returns the splitter's end (its whole tool calls), its
// rest and call deltas already handed to `b`.
template <class Builder>
server::ChatStream::End stream_into(server::ChatStream& text, Builder& b, const std::string& out,
                                    std::vector<nlohmann::json>& events, size_t piece = 3) {
  for (size_t at = 0; at < out.size(); at += piece) {
    const server::ChatStream::Delta d = text.push(out.substr(at, piece));
    b.text(d.content, events);
    b.tool_call_deltas(d.tool_calls, events);
  }
  server::ChatStream::End end = text.finish();
  b.text(end.rest.content, events);
  b.tool_call_deltas(end.tool_call_deltas, events);
  return end;
}

}  // namespace lragent::testing
