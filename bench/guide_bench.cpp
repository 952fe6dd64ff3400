// Host cost of structured outputs on Llama-3's vocabulary (128,256 tokens, fetched by
// scripts/fetch-fixtures.sh into .fixtures/llama3): the first mask of a state (a walk of the
// vocabulary trie through the automaton) and a mask seen before, for a JSON regex (byte_dfa.h)
// and the same language as a GBNF grammar (grammar_dfa.h), inside a JSON string where nearly
// every token is allowed. Skipped when the tokenizer is not there.
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/guide/json_regex.h"
#include "engine/guide/token_guide.h"
#include "tokenizer/tokenizer.h"

namespace lragent::guide {
namespace {

constexpr const char* kJsonGrammar = R"(root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ":" ws value
array  ::= "[" ws ( value ( "," ws value )* )? "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= " "?
)";

struct Vocab {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<VocabTrie> trie;
};

const Vocab* llama3() {
  static const Vocab v = [] {
    Vocab out;
    auto tok = Tokenizer::load_dir(std::string(LRAGENT_SOURCE_DIR) + "/.fixtures/llama3");
    if (!tok.ok()) return out;
    out.tok = std::move(*tok);
    out.trie = VocabTrie::build(*out.tok);
    return out;
  }();
  return v.trie ? &v : nullptr;
}

// A new guide (its masks and automaton start empty) for the JSON language as a regex or a grammar.
std::unique_ptr<TokenGuide> guide(bool grammar, const Vocab& v) {
  JsonRegexOptions o;
  o.whitespace = "[ ]?";
  auto g = grammar ? TokenGuide::compile_grammar(kJsonGrammar, "root", *v.trie)
                   : TokenGuide::compile(json_object_regex(o), *v.trie);
  return g.ok() ? std::move(*g) : nullptr;
}

// The state inside a string value: `{"key": "some text`, as Llama-3 tokenizes its pieces.
int32_t inside_string(TokenGuide& g, const Vocab& v) {
  int32_t s = g.start();
  for (const std::string piece : {"{", "\"", "key", "\"", ":", " \"", "some text"}) {
    const auto ids = v.tok->encode(piece, /*add_special_tokens=*/false);
    if (!ids.ok()) return TokenGuide::kDead;
    for (int32_t id : *ids) s = g.advance(s, id);
  }
  return s;
}

void BM_FirstMask(benchmark::State& state) {
  const Vocab* v = llama3();
  if (!v) return state.SkipWithError("no Llama-3 tokenizer in .fixtures (scripts/fetch-fixtures.sh)");
  const bool grammar = state.range(0) != 0;
  std::vector<float> row(static_cast<size_t>(v->tok->vocab_size()));
  int64_t left = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto g = guide(grammar, *v);
    const int32_t s = inside_string(*g, *v);
    std::fill(row.begin(), row.end(), 0.f);
    state.ResumeTiming();
    left = g->mask(s, row, {});
    benchmark::DoNotOptimize(left);
  }
  state.SetLabel(std::string(grammar ? "grammar" : "regex") + ", " + std::to_string(left) + " tokens allowed");
}
BENCHMARK(BM_FirstMask)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_MaskSeenBefore(benchmark::State& state) {
  const Vocab* v = llama3();
  if (!v) return state.SkipWithError("no Llama-3 tokenizer in .fixtures (scripts/fetch-fixtures.sh)");
  const bool grammar = state.range(0) != 0;
  auto g = guide(grammar, *v);
  const int32_t s = inside_string(*g, *v);
  std::vector<float> row(static_cast<size_t>(v->tok->vocab_size()));
  for (auto _ : state) {
    std::fill(row.begin(), row.end(), 0.f);
    benchmark::DoNotOptimize(g->mask(s, row, {}));
  }
  state.SetLabel(grammar ? "grammar" : "regex");
}
BENCHMARK(BM_MaskSeenBefore)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// A whole document the way a guided request meets it: at each of its tokens the mask of the
// state so far (a state seen before is cached; a new one walks the trie), then the token. A fresh
// guide per iteration, as every request compiles its own.
void BM_JsonDocument(benchmark::State& state) {
  const Vocab* v = llama3();
  if (!v) return state.SkipWithError("no Llama-3 tokenizer in .fixtures (scripts/fetch-fixtures.sh)");
  const bool grammar = state.range(0) != 0;
  const std::string doc =
      R"({"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"], "notes": {"first": )"
      R"("program", "machine": "Analytical Engine", "collaborator": {"name": "Charles Babbage", "born": 1791}}})";
  const auto ids = v->tok->encode(doc, /*add_special_tokens=*/false);
  if (!ids.ok()) return state.SkipWithError("encode failed");
  std::vector<float> row(static_cast<size_t>(v->tok->vocab_size()));
  size_t states = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto g = guide(grammar, *v);
    state.ResumeTiming();
    int32_t s = g->start();
    for (int32_t id : *ids) {
      std::fill(row.begin(), row.end(), 0.f);
      benchmark::DoNotOptimize(g->mask(s, row, {}));
      s = g->advance(s, id);
    }
    if (s == TokenGuide::kDead || !g->accepting(s)) return state.SkipWithError("the document left the language");
    states = g->dfa_states();
  }
  state.SetLabel(fmt::format("{}, {} tokens, {} automaton states", grammar ? "grammar" : "regex", ids->size(), states));
  state.counters["ms/token"] = benchmark::Counter(static_cast<double>(ids->size()),
                                                  benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_JsonDocument)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lragent::guide
