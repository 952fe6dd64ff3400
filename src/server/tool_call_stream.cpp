#include "server/tool_call_stream.h"

#include <algorithm>
#include <utility>

namespace lragent::server {

using json = nlohmann::json;

namespace {
bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
// The end of the longest prefix of text[from, end) that splits no UTF-8 sequence.
size_t utf8_cut(std::string_view text, size_t from, size_t end) {
  size_t i = from;
  while (i < end) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (i + len > end) break;
    i += len;
  }
  return i;
}
}  // namespace

ToolCallStream::ToolCallStream(ToolCallFormat f, bool incremental)
    : format_(f), incremental_(incremental) {}

ToolCallStream::Piece ToolCallStream::push(const std::string& piece) {
  Piece out;
  text_ += piece;
  if (!in_call_) {
    size_t upto = text_.size();
    if (format_ == ToolCallFormat::kLlama3Json || format_ == ToolCallFormat::kPythonic) {
      // vLLM streams a Llama completion as calls when it begins with "{" or <|python_tag|> (a
      // pythonic one with "[" or <|python_start|>): hold the text until its start shows which.
      const bool py = format_ == ToolCallFormat::kPythonic;
      const std::string_view tag = py ? kPythonStart : kPythonTag;
      if (!decided_) {
        if (text_.empty()) return out;
        if (text_[0] == (py ? '[' : '{') || text_.starts_with(tag)) {
          in_call_ = decided_ = true;
          upto = 0;
        } else if (tag.starts_with(text_)) {
          return out;  // may still become the tag
        } else {
          decided_ = true;
        }
      }
    } else {
      const std::string_view open = format_ == ToolCallFormat::kMistral      ? kMistralMarker
                                    : format_ == ToolCallFormat::kDeepSeekV3 ? kDsCallsBegin
                                                                             : kHermesOpen;
      const size_t at = text_.find(open, sent_ >= open.size() ? sent_ - open.size() + 1 : 0);
      if (at != std::string::npos) {
        in_call_ = true;
        upto = at;
      } else {  // hold back a tail that a later piece may complete into the marker
        for (size_t k = std::min(open.size() - 1, text_.size()); k > 0; --k)
          if (text_.compare(text_.size() - k, k, open, 0, k) == 0) {
            upto = text_.size() - k;
            break;
          }
      }
    }
    upto = std::max(upto, sent_);
    out.content = text_.substr(sent_, upto - sent_);
    sent_ = upto;
    call_at_ = upto;
  }
  if (in_call_ && incremental_) {
    scan();
    out.tool_calls = deltas();
  }
  return out;
}

void ToolCallStream::skip_space() {
  while (scan_ < text_.size() && is_ascii_space(text_[scan_])) ++scan_;
}

bool ToolCallStream::read_string(std::string* out) {
  if (text_[scan_] != '"') {
    scan_state_ = Scan::kStopped;
    return false;
  }
  size_t i = scan_ + 1;
  for (; i < text_.size() && text_[i] != '"'; ++i)
    if (text_[i] == '\\') ++i;
  if (i >= text_.size()) return false;  // not closed yet
  const json v = json::parse(std::string_view(text_).substr(scan_, i + 1 - scan_), nullptr, /*allow_exceptions=*/false);
  if (!v.is_string()) {
    scan_state_ = Scan::kStopped;
    return false;
  }
  *out = v.get<std::string>();
  scan_ = i + 1;
  return true;
}

void ToolCallStream::scan_deepseek() {
  if (scan_state_ == Scan::kOpen) {
    scan_ = call_at_ + kDsCallsBegin.size();
    scan_state_ = Scan::kDsSeek;
  }
  while (true) {
    if (scan_state_ == Scan::kDsSeek) {  // the next <｜tool▁call▁begin｜>
      const size_t at = text_.find(kDsCallBegin, scan_);
      if (at == std::string::npos) return;
      scan_ = at + kDsCallBegin.size();
      scan_state_ = Scan::kDsHead;
    }
    if (scan_state_ == Scan::kDsHead) {  // TYPE<｜tool▁sep｜>NAME on one line, then ```json
      const size_t eol = text_.find('\n', scan_);
      if (eol == std::string::npos || text_.size() < eol + kDsJsonOpen.size()) return;
      const std::string_view line = std::string_view(text_).substr(scan_, eol - scan_);
      const size_t sep = line.rfind(kDsSep);
      if (sep == std::string_view::npos || text_.compare(eol, kDsJsonOpen.size(), kDsJsonOpen) != 0) {
        scan_state_ = Scan::kDsSeek;  // not a call block the parser reads: the next one may be
        continue;
      }
      calls_.push_back(Sent{new_tool_call_id(format_), std::string(line.substr(sep + kDsSep.size())), {}, 0, false});
      scan_ = eol + kDsJsonOpen.size();
      scan_state_ = Scan::kDsArgs;
    }
    // The arguments: the rest of the line, as written.
    const size_t eol = text_.find('\n', scan_);
    const size_t end = eol == std::string::npos ? utf8_cut(text_, scan_, text_.size()) : eol;
    calls_.back().arguments.append(text_, scan_, end - scan_);
    scan_ = end;
    if (eol == std::string::npos) return;
    scan_state_ = Scan::kDsSeek;
  }
}

void ToolCallStream::scan_pythonic() {
  python_.read(std::string_view(text_).substr(call_at_));
  const std::vector<PyCallsStream::Call>& calls = python_.calls();
  for (size_t k = 0; k < calls.size(); ++k) {
    if (k == calls_.size()) calls_.push_back(Sent{new_tool_call_id(format_), calls[k].name, {}, 0, false});
    // The stream only appends: only what is new is copied (a long argument is not copied whole
    // at every token).
    calls_[k].arguments.append(calls[k].arguments, calls_[k].arguments.size());
  }
}

void ToolCallStream::scan() {
  if (format_ == ToolCallFormat::kDeepSeekV3) return scan_deepseek();
  if (format_ == ToolCallFormat::kPythonic) return scan_pythonic();
  // Each state reads what it needs from text_ at scan_ and returns when the text ends first.
  while (scan_state_ != Scan::kStopped) {
    switch (scan_state_) {
      case Scan::kOpen:  // the format's opening, at call_at_
        scan_ = call_at_;
        if (format_ == ToolCallFormat::kHermes) {
          scan_ += kHermesOpen.size();
        } else if (format_ == ToolCallFormat::kMistral) {
          scan_ += kMistralMarker.size();
          skip_space();
          if (scan_ >= text_.size()) {
            scan_ = call_at_;
            return;
          }
          if (text_[scan_] != '[') {
            scan_state_ = Scan::kStopped;  // not a list: left for the end
            break;
          }
          ++scan_;
        } else {  // llama3_json
          // in_call_ came with a whole tag or a "{" at the start
          if (text_.compare(scan_, kPythonTag.size(), kPythonTag) == 0) scan_ += kPythonTag.size();
        }
        scan_state_ = Scan::kCallStart;
        break;
      case Scan::kBetween:  // after a call: another one, or the end of the calls
        if (format_ == ToolCallFormat::kHermes) {
          const size_t at = text_.find(kHermesOpen, scan_);
          if (at == std::string::npos) return;
          scan_ = at + kHermesOpen.size();
        } else {
          skip_space();
          if (scan_ >= text_.size()) return;
          const char sep = format_ == ToolCallFormat::kMistral ? ',' : ';';
          if (text_[scan_] != sep) {
            scan_state_ = Scan::kStopped;  // mistral's "]", or the end of a Llama list
            break;
          }
          ++scan_;
        }
        scan_state_ = Scan::kCallStart;
        break;
      case Scan::kCallStart:
        skip_space();
        if (scan_ >= text_.size()) return;
        if (text_[scan_] != '{') {
          scan_state_ = Scan::kStopped;
          break;
        }
        ++scan_;
        has_name_ = args_seen_ = false;
        name_.clear();
        scan_state_ = Scan::kKey;
        break;
      case Scan::kKey:
        skip_space();
        if (scan_ >= text_.size()) return;
        if (text_[scan_] == '}') {
          ++scan_;
          scan_state_ = Scan::kBetween;
          break;
        }
        if (!read_string(&key_)) return;
        scan_state_ = Scan::kColon;
        break;
      case Scan::kColon:
        skip_space();
        if (scan_ >= text_.size()) return;
        if (text_[scan_] != ':') {
          scan_state_ = Scan::kStopped;
          break;
        }
        ++scan_;
        scan_state_ = Scan::kValue;
        break;
      case Scan::kValue: {
        if (!value_) {
          skip_space();
          if (scan_ >= text_.size()) return;
          if (key_ == "name" && text_[scan_] == '"') {
            if (!read_string(&name_)) return;
            has_name_ = true;
            scan_state_ = Scan::kAfterValue;
            break;
          }
          // Llama's calls may name their arguments "parameters"; the first of the two is streamed.
          const bool args = key_ == "arguments" || (format_ == ToolCallFormat::kLlama3Json && key_ == "parameters");
          streaming_ = args && has_name_ && !args_seen_;
          args_seen_ = args_seen_ || args;
          value_.emplace(/*ensure_ascii=*/format_ == ToolCallFormat::kLlama3Json);
          value_->start_at(scan_);
          if (streaming_) calls_.push_back(Sent{new_tool_call_id(format_), name_, {}, 0, false});
        }
        value_->read(text_, streaming_ ? &calls_.back().arguments : nullptr);
        if (value_->failed()) {
          scan_state_ = Scan::kStopped;
          break;
        }
        if (!value_->done()) return;
        scan_ = value_->position();
        value_.reset();
        scan_state_ = Scan::kAfterValue;
        break;
      }
      case Scan::kAfterValue:
        skip_space();
        if (scan_ >= text_.size()) return;
        if (text_[scan_] == ',') {
          scan_state_ = Scan::kKey;
        } else if (text_[scan_] == '}') {
          scan_state_ = Scan::kBetween;
        } else {
          scan_state_ = Scan::kStopped;
          break;
        }
        ++scan_;
        break;
      default: return;  // kStopped (the kDs* states are deepseek_v3's)
    }
  }
}

json ToolCallStream::deltas(bool all) {
  json out = json::array();
  for (size_t k = 0; k < calls_.size(); ++k) {
    Sent& c = calls_[k];
    // A call opens with the first piece of its arguments (a pythonic call's "{" at its first
    // keyword, deepseek_v3's first character), so that its first delta shows whether they are an
    // object (the Messages API streams only those); the calls after it wait their turn.
    if (!c.opened && c.arguments.empty() && !all) break;
    if (c.opened && c.arguments.size() == c.arguments_sent) continue;
    json fn = json::object();
    if (!c.opened) fn["name"] = c.name;
    fn["arguments"] = c.arguments.substr(c.arguments_sent);
    json d = {{"index", k}};
    if (!c.opened) {
      d["id"] = c.id;
      d["type"] = "function";
    }
    d["function"] = std::move(fn);
    out.push_back(std::move(d));
    c.opened = true;
    c.arguments_sent = c.arguments.size();
  }
  return out;
}

ToolCallStream::End ToolCallStream::finish() {
  End end;
  // A Llama (or pythonic) completion streamed as content is content, whatever it holds (as vLLM streams it).
  const bool by_start = format_ == ToolCallFormat::kLlama3Json || format_ == ToolCallFormat::kPythonic;
  const bool parse = !by_start || in_call_ || !decided_;
  const ParsedToolCalls parsed = parse ? parse_tool_calls(format_, text_) : ParsedToolCalls{{}, text_};
  // Calls found: what precedes them that was not sent yet; none: the rest of the text as it is,
  // unless calls went out already (the held text was theirs).
  if (!parsed.calls.empty() || calls_.empty()) {
    const std::string& content = parsed.calls.empty() ? text_ : parsed.content;
    if (content.size() > sent_) end.content = content.substr(sent_);
  }
  for (size_t k = 0; k < std::max(parsed.calls.size(), calls_.size()); ++k) {
    if (k == calls_.size()) {
      calls_.push_back(Sent{new_tool_call_id(format_), parsed.calls[k].name, parsed.calls[k].arguments, 0, false});
    } else if (k < parsed.calls.size() && parsed.calls[k].name == calls_[k].name &&
               parsed.calls[k].arguments.starts_with(calls_[k].arguments)) {
      calls_[k].arguments = parsed.calls[k].arguments;  // the rest of what went out in part
    }
    const Sent& c = calls_[k];
    end.tool_calls.push_back(
        {{"index", k}, {"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  end.deltas = deltas(/*all=*/true);
  sent_ = text_.size();
  return end;
}

}  // namespace lragent::server
