// Tool calls out of a completion's text, in the forms vLLM's parsers read (hermes,
// llama3_json, mistral, deepseek_v3, pythonic), whole and streamed; the form a real template shows its model; and the
// calls a forced tool_choice makes the model write, which each parser must read back.
// The cases follow vLLM's parsers (vllm/entrypoints/openai/tool_parsers/): what each finds, the
// content it leaves, and how it dumps the arguments (json.dumps, ASCII for llama3_json).
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/guide/byte_dfa.h"
#include "server/chat_template.h"
#include "server/template_fixture.h"
#include "server/py_json_stream.h"
#include "server/python_calls_stream.h"
#include "server/tool_call_stream.h"
#include "server/tool_calls.h"

namespace lragent::server {
namespace {

using nlohmann::ordered_json;

// vLLM's Hermes parser: the calls out of <tool_call> blocks (the last may be unclosed), the text
// before the first as content; a block that is not a call leaves the whole text as content.
TEST(ToolCalls, HermesAsVllmParsesThem) {
  ParsedToolCalls none = parse_hermes_tool_calls("just text");
  EXPECT_TRUE(none.calls.empty());
  EXPECT_EQ(none.content, "just text");
  ParsedToolCalls two = parse_hermes_tool_calls(
      "Let me search.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\":\"x\",\"k\":2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"finish\", \"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.content, "Let me search.\n");
  EXPECT_EQ(two.calls[0].name, "search");
  EXPECT_EQ(two.calls[0].arguments, R"({"query": "x", "k": 2})");  // json.dumps, keys in order
  EXPECT_EQ(two.calls[1].arguments, "{}");
  ParsedToolCalls unclosed = parse_hermes_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}}");
  ASSERT_EQ(unclosed.calls.size(), 1u);
  EXPECT_EQ(unclosed.content, "");
  EXPECT_EQ(unclosed.calls[0].arguments, R"({"a": "é"})");  // ensure_ascii=False
  ParsedToolCalls bad = parse_hermes_tool_calls("x<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "x<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(parse_hermes_tool_calls("<tool_call>not json</tool_call>").calls.empty());
}

// vLLM's llama3_json parser: the first JSON object and those after ";", "parameters" or
// "arguments"; no content beside calls; arguments dumped with ensure_ascii.
TEST(ToolCalls, Llama3JsonAsVllmParsesThem) {
  ParsedToolCalls one = parse_llama3_json_tool_calls(R"({"name": "search", "parameters": {"q": "café", "k": 2}})");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "search");
  EXPECT_EQ(one.calls[0].arguments, R"({"q": "caf\u00e9", "k": 2})");
  EXPECT_EQ(one.content, "");
  // After <|python_tag|> (when special tokens are kept), with text around it (dropped, as vLLM does),
  // two calls joined by ";", "arguments" also taken, a brace inside a string and deeper nesting
  // (vLLM's regex sees two levels of braces; the JSON here is scanned as JSON).
  ParsedToolCalls two = parse_llama3_json_tool_calls(
      "<|python_tag|>Sure. {\"name\": \"a\", \"arguments\": {\"s\": \"}{\"}} ;\n {\"name\": \"b\", \"parameters\": "
      "{\"x\": {\"y\": {\"z\": [1, {}]}}}} trailing");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].name, "a");
  EXPECT_EQ(two.calls[0].arguments, R"({"s": "}{"})");
  EXPECT_EQ(two.calls[1].name, "b");
  EXPECT_EQ(two.calls[1].arguments, R"({"x": {"y": {"z": [1, {}]}}})");
  EXPECT_EQ(two.content, "");
  // Not calls: the whole text is content.
  for (const std::string text : {"no braces here", R"({"name": "f"})", R"({"parameters": {}})", R"({"name": 3, "parameters": {}})",
                                 R"({"name": "f", "parameters": {})", "{not json}", R"({"name": "f", "parameters": {}}; {"name": 1})"}) {
    ParsedToolCalls p = parse_llama3_json_tool_calls(text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

// vLLM's mistral parser (a Hugging Face tokenizer): [TOOL_CALLS] then a JSON list of calls; the
// text before the marker is content; not a list of calls: the stripped text without the marker.
TEST(ToolCalls, MistralAsVllmParsesThem) {
  ParsedToolCalls p = parse_mistral_tool_calls(
      "Let me look. [TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"q\": \"café\"}}, {\"name\": \"done\", "
      "\"arguments\": {}}]\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content, "Let me look. ");
  EXPECT_EQ(p.calls[0].name, "search");
  EXPECT_EQ(p.calls[0].arguments, R"({"q": "café"})");  // ensure_ascii=False
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // Text after the list: the "[{...}]" part is taken (vLLM's fallback regex).
  ParsedToolCalls tail = parse_mistral_tool_calls("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}] and more");
  ASSERT_EQ(tail.calls.size(), 1u);
  EXPECT_EQ(tail.content, "");
  EXPECT_EQ(parse_mistral_tool_calls("no marker {\"name\": \"f\"}").content, "no marker {\"name\": \"f\"}");
  for (const auto& [text, content] : std::vector<std::pair<std::string, std::string>>{
           {"[TOOL_CALLS] {\"name\": \"f\", \"arguments\": {}} ", "{\"name\": \"f\", \"arguments\": {}}"},  // not a list
           {"x[TOOL_CALLS][{\"name\": \"f\"}]", "x[{\"name\": \"f\"}]"},                                   // no arguments
           {"[TOOL_CALLS] oops", "oops"},
           {"[TOOL_CALLS]\u00a0oops\u3000", "oops"},  // str.strip: Unicode whitespace too
           {"[TOOL_CALLS][]", "[]"}}) {
    ParsedToolCalls q = parse_mistral_tool_calls(text);
    EXPECT_TRUE(q.calls.empty()) << text;
    EXPECT_EQ(q.content, content) << text;
  }
  for (int i = 0; i < 20; ++i) {  // ids a Mistral template takes back: 9 letters and digits
    const std::string id = new_tool_call_id(ToolCallFormat::kMistral);
    ASSERT_EQ(id.size(), 9u);
    for (char c : id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  }
  EXPECT_EQ(new_tool_call_id(ToolCallFormat::kHermes).rfind("chatcmpl-tool-", 0), 0u);
}

// DeepSeek's calls as vLLM's deepseek_v3 regex reads them: every call block, its arguments the
// text as written; the content before the first "<｜tool▁calls▁begin｜>".
TEST(ToolCalls, DeepSeekV3AsVllmParsesThem) {
  const std::string two =
      "I will check. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n"
      "{\"q\":\"café\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ParsedToolCalls p = parse_deepseek_v3_tool_calls(two);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.content, "I will check. ");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.calls[1].arguments, R"({"q":"café"})");  // as written, not parsed and dumped again
  // The type runs to the line's last separator (vLLM's greedy '.*'); a block that does not close
  // as the regex wants is skipped, the others stay.
  ParsedToolCalls q = parse_deepseek_v3_tool_calls(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>x<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{\"a\":\n1}\n```<｜tool▁call▁end｜>");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].name, "f");
  for (const std::string& none :
       {std::string("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>"),  // no calls marker
        std::string("<｜tool▁calls▁begin｜>oops"),
        std::string("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}")}) {
    ParsedToolCalls r = parse_deepseek_v3_tool_calls(none);
    EXPECT_TRUE(r.calls.empty()) << none;
    EXPECT_EQ(r.content, none);
  }
}

// The form each real template shows its model, and the parser names.
// vLLM's pythonic parser: the whole text a Python list of calls with literal keyword arguments,
// arguments dumped as json.dumps(ensure_ascii=False); anything else is content. Negative numbers
// and JSON's true / false / null are taken (vLLM's ast walk refuses the first, Python the second).
TEST(ToolCalls, PythonicAsVllmParsesThem) {
  ParsedToolCalls one = parse_pythonic_tool_calls(R"([get_weather(city="San Francisco", metric="celsius")])");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, R"({"city": "San Francisco", "metric": "celsius"})");
  EXPECT_EQ(one.content, "");
  ParsedToolCalls two = parse_pythonic_tool_calls(
      "[a(x=1, y=2.5, z=True, w=None, l=[1, 'two', {'k': False, 3: 1e3}],), \n b()]\n");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].arguments, R"({"x": 1, "y": 2.5, "z": true, "w": null, "l": [1, "two", {"k": false, "3": 1000.0}]})");
  EXPECT_EQ(two.calls[1].name, "b");
  EXPECT_EQ(two.calls[1].arguments, "{}");
  EXPECT_EQ(parse_pythonic_tool_calls(R"([f(s="é\u00e9\x41", t='it\'s\n', r=r'\d+', j="a" 'b', q="""x"y""", o="\101\0")])").calls.at(0).arguments,
            R"({"s": "ééA", "t": "it's\n", "r": "\\d+", "j": "ab", "q": "x\"y", "o": "A\u0000"})");
  EXPECT_EQ(parse_pythonic_tool_calls("<|python_start|>[f(a=-1, b=true, c=null)]<|python_end|>").calls.at(0).arguments,
            R"({"a": -1, "b": true, "c": null})");
  for (const char* text : {"Sure, here it is", "[1, 2]", "[f(1)]", "[f(a=1, a=2)]", "[a.b(x=1)]", "[f(a=x)]",
                           "[f(a=1)] trailing", "[]", "[f(a=(1, 2))]", "[f(a=1180591620717411303424)]", "[f(a=007)]",
                           "[f(a='unclosed)]", "[f(a=1e999)]", "[f(a='\\ud800')]", "[f(a=1 + 2)]"}) {
    const ParsedToolCalls none = parse_pythonic_tool_calls(text);
    EXPECT_TRUE(none.calls.empty()) << text;
    EXPECT_EQ(none.content, text);
  }
  // As deep as a fuzzer likes: refused, not a stack overflow.
  EXPECT_TRUE(parse_pythonic_tool_calls("[f(a=" + std::string(100000, '[')).calls.empty());
}

// Pythonic calls read as they are written (PyCallsStream): after every piece each call's
// arguments so far are a prefix of what the whole parse gives, and at the end they are all of it;
// what parse_python_calls refuses stops the stream.
TEST(ToolCalls, PythonicCallsStreamAsTheyAreWritten) {
  const std::vector<std::string> texts = {
      R"([f(s="é\u00e9\x41", t='it\'s\n', r=r'\d+\'', j="a" 'b' r"\c", q="""x"y""", o="\101\0", e="")])",
      "<|python_start|>[f(a=-1, b=true, c=null, d=False)]<|python_end|>",
      R"([f(x=[1, 2.5, -.5e-3, {"k": [True, None], 7: 'v', -2: [],}], y={}, z=[],)])",
      "  [ f ( a = 1_000 , b = 1e5 ) ,\n g() , ]",
      R"([f(n=12345678901234567890, m=-9223372036854775808, q='''it''s''', u=u'\u00fc')])",
      R"([f(s='😀 \😀 \q', t="tab\tend")])",
  };
  std::mt19937 rng(5);
  for (const std::string& text : texts)
    for (int mode = 0; mode < 2; ++mode) {
      const ParsedToolCalls whole = parse_tool_calls(ToolCallFormat::kPythonic, text);
      ASSERT_FALSE(whole.calls.empty()) << text;
      PyCallsStream s;
      size_t went_out_early = 0;
      for (size_t at = 0; at < text.size();) {
        at = std::min(text.size(), at + (mode == 0 ? 1 : 1 + rng() % 6));
        s.read(std::string_view(text).substr(0, at));
        ASSERT_FALSE(s.failed()) << text.substr(0, at);
        ASSERT_LE(s.calls().size(), whole.calls.size());
        for (size_t k = 0; k < s.calls().size(); ++k) {
          EXPECT_EQ(s.calls()[k].name, whole.calls[k].name);
          EXPECT_TRUE(whole.calls[k].arguments.starts_with(s.calls()[k].arguments))
              << text.substr(0, at) << "\n sent: " << s.calls()[k].arguments << "\n whole: " << whole.calls[k].arguments;
        }
        if (!s.done() && !s.calls().empty()) went_out_early += s.calls()[0].arguments.size();
      }
      EXPECT_TRUE(s.done()) << text;
      EXPECT_FALSE(s.repeated_key());
      ASSERT_EQ(s.calls().size(), whole.calls.size()) << text;
      for (size_t k = 0; k < whole.calls.size(); ++k) EXPECT_EQ(s.calls()[k].arguments, whole.calls[k].arguments) << text;
      EXPECT_GT(went_out_early, 0u) << text;
    }
  // Outside the subset: a positional argument, a keyword twice, an empty list, a hex number, an
  // attribute call, a tuple, a float dict key, a string broken by a newline, a misspelt literal,
  // two values.
  for (const char* bad : {"[f(1)]", "[f(a=1, a=2)]", "[]", "[f(a=0x10)]", "[a.b()]", "[f(a=(1, 2))]",
                          "[f(a={1.5: 2})]", "[f(a='x\ny')]", "[f(a=Tru)]", "[f(a=1 2)]"}) {
    PyCallsStream s;
    s.read(std::string(bad) + " ");
    EXPECT_TRUE(s.failed()) << bad;
    EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kPythonic, bad).calls.empty()) << bad;
  }
  // Cut off (max_tokens): what went out stays a prefix, and the stream waits.
  PyCallsStream cut;
  cut.read(R"([search(query="lragent kv sh)");
  ASSERT_EQ(cut.calls().size(), 1u);
  EXPECT_EQ(cut.calls()[0].arguments, R"({"query": "lragent kv sh)");
  EXPECT_FALSE(cut.done() || cut.failed());
  // Bytes that are no UTF-8 (a model's stray lead byte, escaped or not, just before a quote): the
  // quote still closes the literal, as in the parse (found by the fuzzer).
  for (const std::string stray : {"[f(a=\"x\\\xfd\", b='\xd9', c=r'\\\xe2', d=\"\xf0\x9f\")]"}) {
    PyCallsStream s;
    for (size_t at = 1; at <= stray.size(); ++at) s.read(std::string_view(stray).substr(0, at));
    EXPECT_TRUE(s.done()) << stray;
    ASSERT_EQ(s.calls().size(), 1u);
    EXPECT_EQ(parse_tool_calls(ToolCallFormat::kPythonic, stray).calls.size(), 1u);
  }
  // A dict that repeats a key: the one difference with the whole parse, and it says so.
  PyCallsStream twice;
  twice.read("[f(d={'a': 1, 'a': 2})]");
  EXPECT_TRUE(twice.done() && twice.repeated_key());
}

// The same on generated calls: random literals of every kind the subset takes (numbers in their
// spellings, strings in every quoting with escapes and non-ASCII text, adjacent literals, nested
// lists and dicts with string and integer keys, trailing commas, odd spacing), read in random
// pieces: the stream reads every one whole and gives exactly the parse's arguments.
TEST(ToolCalls, PythonicCallsStreamAsTheParseReadsGeneratedCalls) {
  std::mt19937 rng(17);
  auto pick = [&](std::initializer_list<const char*> xs) { return std::string(*(xs.begin() + rng() % xs.size())); };
  auto sp = [&] { return pick({"", "", " ", "\n  "}); };
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    switch (rng() % (depth < 3 ? 8 : 6)) {
      case 0: return pick({"0", "7", "-42", "1_000", "12345678901234567890", "-9223372036854775808"});
      case 1: return pick({"1.5", "-.5e-3", "1e5", "2.", "0.1", "3.0E+2"});
      case 2: return pick({"True", "False", "None", "true", "false", "null"});
      case 3: {
        const std::string body = pick({"", "a", "Z\\u00fcrich", "it\\'s", "tab\\there", "\\x41\\101\\0", "é😀",
                                       "a \\\"q\\\" b", "back\\\\slash", "\\q", "line\\\nnext"});
        const std::string q = pick({"\"", "'"});
        return q + body + q;
      }
      case 4: {  // triple-quoted, raw, prefixed, or adjacent literals
        const std::string form = pick({"\"\"\"x\"y\n\"\"\"", "'''it''s'''", "r'\\d+\\''", "R\"\\w\"", "u'\\u00e9'",
                                       "\"a\" 'b'", "'x'\n  r\"\\y\" \"z\""});
        return form;
      }
      case 5: return "\"" + std::string(rng() % 40, 'w') + "\"";
      case 6: {
        std::string out = "[" + sp();
        const int n = static_cast<int>(rng() % 4);
        for (int i = 0; i < n; ++i) out += (i ? "," + sp() : "") + value(depth + 1);
        return out + (n && rng() % 3 == 0 ? "," : "") + sp() + "]";
      }
      default: {
        std::string out = "{" + sp();
        const int n = static_cast<int>(rng() % 4);
        for (int i = 0; i < n; ++i)
          out += (i ? ", " : "") + (rng() % 4 ? "'k" + std::to_string(i) + "'" : std::to_string(i) + "") + sp() + ":" +
                 sp() + value(depth + 1);
        return out + (n && rng() % 3 == 0 ? "," : "") + "}";
      }
    }
  };
  for (int round = 0; round < 600; ++round) {
    std::string text = rng() % 4 == 0 ? "<|python_start|>[" : "[";
    const int calls = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < calls; ++c) {
      text += (c ? "," + sp() : "") + "f" + std::to_string(c) + sp() + "(";
      const int args = static_cast<int>(rng() % 4);
      for (int a = 0; a < args; ++a) text += (a ? "," + sp() : "") + "k" + std::to_string(a) + sp() + "=" + sp() + value(0);
      text += (args && rng() % 4 == 0 ? "," : "") + std::string(")");
    }
    text += sp() + "]";
    if (text.starts_with("<|")) text += "<|python_end|>";
    const ParsedToolCalls whole = parse_tool_calls(ToolCallFormat::kPythonic, text);
    ASSERT_EQ(whole.calls.size(), static_cast<size_t>(calls)) << text;
    PyCallsStream s;
    for (size_t at = 0; at < text.size() && !s.done();) {
      at = std::min(text.size(), at + 1 + rng() % 7);
      s.read(std::string_view(text).substr(0, at));
      ASSERT_FALSE(s.failed()) << text.substr(0, at);
    }
    ASSERT_TRUE(s.done()) << text;
    ASSERT_EQ(s.calls().size(), whole.calls.size()) << text;
    for (size_t k = 0; k < whole.calls.size(); ++k)
      ASSERT_EQ(s.calls()[k].arguments, whole.calls[k].arguments) << text;
  }
}

TEST(ToolCalls, TheFormFollowsTheTemplate) {
  const auto tokens = testing::template_tokens();
  for (const auto& [name, format] : std::vector<std::pair<std::string, ToolCallFormat>>{
           {"qwen2_5", ToolCallFormat::kHermes},
           {"qwen3", ToolCallFormat::kHermes},
           {"llama3_2", ToolCallFormat::kLlama3Json},
           {"mistral_nemo", ToolCallFormat::kMistral},
           {"llama3", ToolCallFormat::kLlama3Json},  // shows no tools, but is Llama's
           {"gemma3", ToolCallFormat::kHermes},      // shows no form: the default
           {"deepseek_v3", ToolCallFormat::kDeepSeekV3},
       }) {
    auto t = ChatTemplate::from_tokenizer_config(testing::config_for(name, tokens), name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.error().message;
    EXPECT_EQ(t->tool_call_format, format) << name;
  }
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
                           ToolCallFormat::kDeepSeekV3, ToolCallFormat::kPythonic})
    EXPECT_EQ(*parse_tool_call_format(tool_call_format_name(f)), f);
  EXPECT_EQ(*parse_tool_call_format("llama4_pythonic"), ToolCallFormat::kPythonic);
  // vLLM's pythonic templates show the model the form; Llama 4's writes <|python_start|>.
  EXPECT_EQ(detect_tool_call_format("... in the format [func_name1(params_name1=params_value1, params_name2=params_value2...), "
                                    "func_name2(params)] ... <|start_header_id|>"),
            ToolCallFormat::kPythonic);
  EXPECT_EQ(detect_tool_call_format("{{- '<|python_start|>' }}<|header_start|>"), ToolCallFormat::kPythonic);
  auto bad = parse_tool_call_format("jamba");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("hermes, llama3_json, mistral"), std::string::npos) << bad.error().message;
}

// Streamed: content goes out until a call could begin (a split marker is held), the calls come
// whole at the end with their index; text that holds no valid call is content.
TEST(ToolCalls, StreamHoldsBackFromTheCall) {
  ToolCallStream a;
  std::string shown;
  const std::vector<std::string> pieces = {"Let me ", "search.<tool", "_call>\n{\"name\": ", "\"s\", \"arguments\": {\"q\": 1}}",
                                           "\n</tool_call>"};
  for (const std::string& p : pieces) {
    shown += a.push(p).content;
    EXPECT_EQ(shown.find('<'), std::string::npos) << shown;
  }
  EXPECT_EQ(shown, "Let me search.");
  ToolCallStream::End end = a.finish();
  EXPECT_EQ(end.content, "");
  ASSERT_EQ(end.tool_calls.size(), 1u);
  EXPECT_EQ(end.tool_calls[0]["index"], 0);
  EXPECT_EQ(end.tool_calls[0]["function"]["name"], "s");
  EXPECT_EQ(end.tool_calls[0]["function"]["arguments"], R"({"q": 1})");
  EXPECT_EQ(end.tool_calls[0]["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);

  ToolCallStream b;  // not a call: all of it is content in the end
  EXPECT_EQ(b.push("a<tool_call>oops").content, "a");
  EXPECT_EQ(b.finish().content, "<tool_call>oops");
  ToolCallStream c;  // a tail that only looked like the start of one
  EXPECT_EQ(c.push("hello <tool").content, "hello ");
  EXPECT_EQ(c.push("box> done").content, "<toolbox> done");
  ToolCallStream::End rest = c.finish();
  EXPECT_EQ(rest.content, "");
  EXPECT_TRUE(rest.tool_calls.empty());
  ToolCallStream d;
  EXPECT_EQ(d.push("x <tool").content, "x ");
  EXPECT_EQ(d.finish().content, "<tool");

  // Mistral: the same around [TOOL_CALLS]; its ids are 9 characters.
  ToolCallStream m(ToolCallFormat::kMistral);
  EXPECT_EQ(m.push("Sure [TOOL").content, "Sure ");
  EXPECT_EQ(m.push("_CALLS][{\"name\": \"f\", ").content, "");
  EXPECT_EQ(m.push("\"arguments\": {}}]").content, "");
  ToolCallStream::End mend = m.finish();
  EXPECT_EQ(mend.content, "");
  ASSERT_EQ(mend.tool_calls.size(), 1u);
  EXPECT_EQ(mend.tool_calls[0]["function"]["name"], "f");
  EXPECT_EQ(mend.tool_calls[0]["id"].get<std::string>().size(), 9u);

  // Llama: a completion that begins with "{" (or <|python_tag|>) is held and parsed at the end;
  // one that begins otherwise streams as content, calls or not (as vLLM streams it).
  ToolCallStream l(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(l.push("{\"name\": \"f\", ").content, "");
  EXPECT_EQ(l.push("\"parameters\": {\"a\": 1}}").content, "");
  ToolCallStream::End lend = l.finish();
  EXPECT_EQ(lend.content, "");
  ASSERT_EQ(lend.tool_calls.size(), 1u);
  EXPECT_EQ(lend.tool_calls[0]["function"]["arguments"], R"({"a": 1})");
  ToolCallStream tag(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(tag.push("<|python").content, "");
  EXPECT_EQ(tag.push("_tag|>{\"name\": \"g\", \"parameters\": {}}").content, "");
  EXPECT_EQ(tag.finish().tool_calls.size(), 1u);
  ToolCallStream prose(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(prose.push("<|py").content, "");  // may still be the tag
  EXPECT_EQ(prose.push("thon> {\"name\": \"f\", \"parameters\": {}}").content, "<|python> {\"name\": \"f\", \"parameters\": {}}");
  ToolCallStream::End pend = prose.finish();
  EXPECT_EQ(pend.content, "");
  EXPECT_TRUE(pend.tool_calls.empty());
  ToolCallStream bad_call(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(bad_call.push("{oops").content, "");
  EXPECT_EQ(bad_call.finish().content, "{oops");

  // Pythonic: the same by the first character, "[" (or <|python_start|>).
  ToolCallStream py(ToolCallFormat::kPythonic);
  EXPECT_EQ(py.push("[search(query=").content, "");
  EXPECT_EQ(py.push("'x'), finish()]").content, "");
  ToolCallStream::End pyend = py.finish();
  EXPECT_EQ(pyend.content, "");
  ASSERT_EQ(pyend.tool_calls.size(), 2u);
  EXPECT_EQ(pyend.tool_calls[0]["function"]["arguments"], R"({"query": "x"})");
  EXPECT_EQ(pyend.tool_calls[1]["index"], 1);
  ToolCallStream py_prose(ToolCallFormat::kPythonic);
  EXPECT_EQ(py_prose.push("Calling [f(a=1)]").content, "Calling [f(a=1)]");
  EXPECT_TRUE(py_prose.finish().tool_calls.empty());
  ToolCallStream py_list(ToolCallFormat::kPythonic);  // a list that is no call: content at the end
  EXPECT_EQ(py_list.push("[1, 2]").content, "");
  EXPECT_EQ(py_list.finish().content, "[1, 2]");
}

// PyJsonStream writes a value as python_json_dumps writes it parsed, while it is being written:
// fed one byte at a time and in random pieces, every output so far is a prefix of the dump and
// the whole is the dump; it stops at the value's end; what is not JSON fails.
TEST(ToolCalls, PyJsonStreamWritesTheDumpAsTheValueComes) {
  const std::vector<std::string> values = {
      R"({"city":"Paris","days":3,"units":["c","f"],"ok":true,"none":null,"neg":false})",
      "{ \"nested\" : { \"a\" : [ 1 , 2.50 , -0 , 1e5 , -3.25E-2 , [ ] , { } ] } ,\n\t\"b\":\"x\" }",
      R"({"esc":"q\"uote\\ back\/slash\n\t\r\b\f \u0001 \u00e9 \ud83d\ude00 raw é中😀"})",
      R"(["a", 12345678901234567890, 0.1, 100.0, 1E+2])",
      R"("just a string with \u20ac")",
      R"({})",
      R"([[[[["deep"]]]]])",
  };
  std::mt19937 rng(7);
  for (const std::string& v : values)
    for (bool ascii : {false, true}) {
      const std::string want = python_json_dumps(nlohmann::ordered_json::parse(v), ascii);
      // The value is followed by more text (a call object's "}"): the stream stops before it.
      const std::string text = v + " }\n</tool_call>";
      for (int mode = 0; mode < 3; ++mode) {
        PyJsonStream js(ascii);
        std::string out, fed;
        size_t at = 0;
        while (at < text.size() && !js.done()) {
          const size_t n = mode == 0 ? 1 : mode == 1 ? 1 + rng() % 7 : text.size();
          fed += text.substr(at, n);
          at += n;
          js.read(fed, &out);
          ASSERT_FALSE(js.failed()) << v;
          ASSERT_EQ(want.compare(0, out.size(), out), 0) << "not a prefix of the dump: " << out << " / " << want;
        }
        EXPECT_TRUE(js.done()) << v;
        EXPECT_EQ(out, want) << v;
        EXPECT_EQ(js.position(), v.size()) << v;
      }
    }
  // A string goes out as it comes, a number only once it is complete.
  PyJsonStream s;
  std::string out;
  s.read(R"({"q": "hel)", &out);
  EXPECT_EQ(out, R"({"q": "hel)");
  s.read(R"({"q": "hello", "n": 12)", &out);
  EXPECT_EQ(out, R"({"q": "hello", "n": )");
  s.read(R"({"q": "hello", "n": 123})", &out);
  EXPECT_EQ(out, R"({"q": "hello", "n": 123})");
  EXPECT_TRUE(s.done());
  PyJsonStream half;  // half an escape and half a UTF-8 sequence wait for the rest
  std::string h;
  half.read("\"a\\u00", &h);
  EXPECT_EQ(h, "\"a");
  half.read("\"a\\u00e9\xc3", &h);
  EXPECT_EQ(h, "\"a\xc3\xa9");
  half.read("\"a\\u00e9\xc3\xa9\"", &h);
  EXPECT_EQ(h, "\"a\xc3\xa9\xc3\xa9\"");

  for (const std::string bad : {R"({"a" 1})", "[1,]", R"({"a": tru })", R"("\x")", "{,}", "[1 2]", R"(["\ud800"])",
                                R"({"a": 1]})", "]", "\"tab\there\""}) {
    PyJsonStream js;
    js.read(bad, nullptr);
    EXPECT_TRUE(js.failed()) << bad;
  }
  std::string deep(300, '[');
  PyJsonStream too_deep;
  too_deep.read(deep, nullptr);
  EXPECT_TRUE(too_deep.failed());
}

// The calls a stream's deltas add up to, joined by index as OpenAI's clients join them.
struct Joined {
  nlohmann::json calls = nlohmann::json::array();  // [{"id", "name", "arguments"}]
  void add(const nlohmann::json& deltas) {
    for (const nlohmann::json& d : deltas) {
      const size_t k = d["index"];
      ASSERT_LE(k, calls.size()) << d.dump();
      if (k == calls.size()) {
        ASSERT_TRUE(d.contains("id") && d["function"].contains("name")) << "a call's first delta names it: " << d.dump();
        // ... and holds the first piece of its arguments, which shows whether they are an object
        // (the Messages API streams only those).
        EXPECT_TRUE(d["function"]["arguments"].get<std::string>().starts_with("{")) << d.dump();
        calls.push_back({{"id", d["id"]}, {"name", d["function"]["name"]}, {"arguments", ""}});
      } else {
        ASSERT_FALSE(d.contains("id")) << d.dump();
      }
      calls[k]["arguments"] = calls[k]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
    }
  }
};

// Incremental (the chat completions stream): a call opens as soon as its name is read and its
// arguments reached, they go out as they are written, and the deltas add up to exactly the calls
// of the text parsed whole (with the ids the whole list reports).
TEST(ToolCalls, StreamedArgumentsAddUpToTheParsedCalls) {
  struct Case {
    ToolCallFormat format;
    std::string text;
    std::string content;  // what goes out as content
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::kHermes,
       "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Z\\u00fcrich\", \"days\": 3, "
       "\"units\": [\"c\", \"f\"], \"note\": \"a \\\"quoted\\\" é\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", "
       "\"arguments\": {}}\n</tool_call>",
       "Let me check."},
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": [1, 2.5, {\"y\": null}]}}, {\"name\": \"b\", "
       "\"arguments\": {\"s\": \"😀\"}}]",
       ""},
      {ToolCallFormat::kLlama3Json,
       "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"city\": \"Zürich\", \"n\": 1e2}}; {\"name\": \"g\", "
       "\"parameters\": {}}",
       ""},
      {ToolCallFormat::kPythonic,
       "[get_weather(city=\"Z\\u00fcrich\", days=3, units=['c', \"f\"], note='a \"quoted\" é' \" and more\"), t()]",
       ""},
  };
  std::mt19937 rng(11);
  for (const Case& c : cases)
    for (int mode = 0; mode < 2; ++mode) {
      const ParsedToolCalls whole = parse_tool_calls(c.format, c.text);
      ASSERT_EQ(whole.calls.size(), 2u) << c.text;
      ToolCallStream s(c.format, /*incremental=*/true);
      Joined joined;
      std::string content;
      size_t deltas_before_end = 0;
      for (size_t at = 0; at < c.text.size();) {
        const size_t n = mode == 0 ? 1 : 1 + rng() % 9;
        ToolCallStream::Piece p = s.push(c.text.substr(at, n));
        at += n;
        content += p.content;
        deltas_before_end += p.tool_calls.size();
        joined.add(p.tool_calls);
      }
      ToolCallStream::End end = s.finish();
      content += end.content;
      joined.add(end.deltas);
      EXPECT_EQ(content, c.content);
      EXPECT_GT(deltas_before_end, 4u) << "the arguments went out in pieces before the end";
      ASSERT_EQ(joined.calls.size(), 2u);
      ASSERT_EQ(end.tool_calls.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(joined.calls[k]["name"], whole.calls[k].name);
        EXPECT_EQ(joined.calls[k]["arguments"], whole.calls[k].arguments) << c.text;
        EXPECT_EQ(end.tool_calls[k]["id"], joined.calls[k]["id"]);
        EXPECT_EQ(end.tool_calls[k]["function"]["arguments"], whole.calls[k].arguments);
      }
    }

  // Arguments before the name: that call comes whole at the end.
  ToolCallStream late(ToolCallFormat::kHermes, true);
  EXPECT_TRUE(late.push("<tool_call>{\"arguments\": {\"a\": 1}, ").tool_calls.empty());
  EXPECT_TRUE(late.push("\"name\": \"f\"}</tool_call>").tool_calls.empty());
  ToolCallStream::End late_end = late.finish();
  ASSERT_EQ(late_end.deltas.size(), 1u);
  EXPECT_EQ(late_end.deltas[0]["function"]["arguments"], R"({"a": 1})");

  // Cut off inside its arguments (max_tokens): the call that went out stands, and the text that
  // was its call is not sent again as content.
  ToolCallStream cut(ToolCallFormat::kHermes, true);
  EXPECT_EQ(cut.push("Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"par").content, "Hi ");
  ToolCallStream::End cut_end = cut.finish();
  EXPECT_EQ(cut_end.content, "");
  EXPECT_TRUE(cut_end.deltas.empty());
  ASSERT_EQ(cut_end.tool_calls.size(), 1u);
  EXPECT_EQ(cut_end.tool_calls[0]["function"]["arguments"], R"({"q": "par)");

  // Not incremental (a request that is not streamed): the calls come whole at the end.
  ToolCallStream plain(ToolCallFormat::kHermes);
  EXPECT_TRUE(plain.push("<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": 1}}").tool_calls.empty());
  EXPECT_EQ(plain.finish().deltas.size(), 1u);
  // DeepSeek-V3: its arguments go out as written (a UTF-8 sequence whole), block by block.
  ToolCallStream ds(ToolCallFormat::kDeepSeekV3, true);
  const std::string ds_text =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"q\": \"Zürich\"}\n```<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const ParsedToolCalls ds_whole = parse_tool_calls(ToolCallFormat::kDeepSeekV3, ds_text);
  ASSERT_EQ(ds_whole.calls.size(), 2u);
  Joined ds_joined;
  std::string ds_content;
  size_t ds_pieces = 0;
  for (char ch : ds_text) {
    ToolCallStream::Piece p = ds.push(std::string(1, ch));
    ds_content += p.content;
    for (const nlohmann::json& d : p.tool_calls) {
      ++ds_pieces;
      const std::string a = d["function"]["arguments"];
      EXPECT_NO_THROW((void)nlohmann::json(a).dump()) << "a piece split a UTF-8 sequence";
    }
    ds_joined.add(p.tool_calls);
  }
  ToolCallStream::End ds_end = ds.finish();
  ds_joined.add(ds_end.deltas);
  EXPECT_EQ(ds_content + ds_end.content, "Sure.");
  EXPECT_GT(ds_pieces, 10u);
  ASSERT_EQ(ds_joined.calls.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(ds_joined.calls[k]["name"], ds_whole.calls[k].name);
    EXPECT_EQ(ds_joined.calls[k]["arguments"], ds_whole.calls[k].arguments);
  }
}

// A forced tool_choice asks for calls in the parser's form: a call the regex takes is read back
// by that parser, and a call in another form is refused by the regex.
TEST(ToolCalls, ForcedCallsAreWhatTheParserReads) {
  const ordered_json tools = ordered_json::parse(R"([
      {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
        "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
      {"type": "function", "function": {"name": "finish"}}])");
  auto full_match = [](const std::string& re, const std::string& text) {
    auto dfa = guide::ByteDfa::compile(re);
    EXPECT_TRUE(dfa.ok()) << dfa.error().message;
    if (!dfa.ok()) return false;
    int32_t s = (*dfa)->start();
    for (unsigned char c : text) s = (*dfa)->next(s, c);
    return (*dfa)->accepting(s);
  };
  struct Case {
    ToolCallFormat format;
    std::string one, two, other_form;  // a named call of search; two calls ("required"); a call in another form
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
       "\"finish\", \"arguments\": {}}\n</tool_call>",
       "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}"},
      {ToolCallFormat::kLlama3Json, "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}",
       "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}; {\"name\": \"finish\", \"parameters\": {}}",
       "{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}]",
       "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}, {\"name\": \"finish\", \"arguments\": {}}]",
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>"},
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"x\"}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"x\"}\n```"
       "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>finish\n```json\n{}\n```<｜tool▁call▁end｜>"
       "<｜tool▁calls▁end｜>",
       "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}]"},
      {ToolCallFormat::kPythonic, "[search(query=\"x\")]", "[search(query=\"x\"), finish()]",
       "{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(tool_call_format_name(c.format));
    auto named = forced_tool_calls_regex(c.format, tools, "search");
    auto any = forced_tool_calls_regex(c.format, tools, "");
    ASSERT_TRUE(named.ok() && any.ok());
    EXPECT_TRUE(full_match(*named, c.one));
    EXPECT_FALSE(full_match(*named, c.two));  // a named function: one call
    EXPECT_TRUE(full_match(*any, c.one));
    EXPECT_TRUE(full_match(*any, c.two));
    EXPECT_FALSE(full_match(*any, c.other_form));
    EXPECT_EQ(parse_tool_calls(c.format, c.one).calls.size(), 1u);
    const ParsedToolCalls two = parse_tool_calls(c.format, c.two);
    ASSERT_EQ(two.calls.size(), 2u);
    EXPECT_EQ(two.calls[0].arguments, R"({"query": "x"})");
    EXPECT_EQ(two.calls[1].name, "finish");
    EXPECT_EQ(two.content, "");
    auto unknown = forced_tool_calls_regex(c.format, tools, "nope");
    ASSERT_FALSE(unknown.ok());
    EXPECT_NE(unknown.error().message.find("'nope'"), std::string::npos);
  }
  // Pythonic: every property written, in order, optional ones too; a name Python cannot call is refused.
  const ordered_json more = ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]}}},
      {"type": "function", "function": {"name": "my-tool"}},
      {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {"x-y": {}}}}}])");
  auto f = forced_tool_calls_regex(ToolCallFormat::kPythonic, more, "f");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_TRUE(full_match(*f, "[f(a=-3, b=true)]"));
  EXPECT_FALSE(full_match(*f, "[f(a=-3)]"));
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kPythonic, "[f(a=-3, b=true)]").calls.at(0).arguments, R"({"a": -3, "b": true})");
  for (const char* bad : {"my-tool", "g"}) {
    auto r = forced_tool_calls_regex(ToolCallFormat::kPythonic, more, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kUnsupported) << r.error().message;
  }
}

}  // namespace
}  // namespace lragent::server
