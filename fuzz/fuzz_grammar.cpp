// libFuzzer target: GBNF grammars (engine/guide/grammar.h) from untrusted request text, and
// Lark grammars (no "::=") through lark_to_gbnf first, as the server takes them. The input up to
// its first NUL is the grammar; the bytes after it are walked through its automaton
// (grammar_dfa.h). A grammar that parses must also parse with the reasoning prefix in front
// (grammar_after_reasoning), and a walk must answer within the automaton's bounds. Every input
// must give a grammar or an error, never a crash, a throw or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/guide/grammar.h"
#include "engine/guide/grammar_dfa.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  const std::string_view walk = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  std::string gbnf(text), start = "root";
  if (lragent::guide::looks_like_lark(text)) {
    auto converted = lragent::guide::lark_to_gbnf(text, &start);
    if (!converted.ok()) return 0;
    gbnf = std::move(*converted);
  }
  auto g = lragent::guide::Grammar::parse(gbnf, start);
  if (!g.ok()) return 0;
  std::string root;
  const std::string wrapped = lragent::guide::grammar_after_reasoning(gbnf, start, &root);
  if (!lragent::guide::Grammar::parse(wrapped, root).ok()) std::abort();  // the prefix broke a good grammar
  lragent::guide::GrammarDfa dfa(std::move(*g));
  // Grammar::parse refused every grammar with no whole match, so the start state is alive
  // unless a bound (too many parses, too many nodes) stopped it.
  if (dfa.start() == lragent::guide::GrammarDfa::kDead && dfa.exhausted().empty() && dfa.cut().empty()) std::abort();
  int32_t s = dfa.start();
  for (unsigned char c : walk) {
    s = dfa.next(s, c);
    if (s == lragent::guide::GrammarDfa::kDead) break;
    (void)dfa.accepting(s);
    (void)dfa.can_continue(s);
  }
  return 0;
}
