// Context-free grammars for structured outputs: vLLM's `guided_grammar` and llama.cpp's `grammar`,
// both written in GBNF (llama.cpp's grammars/README.md, the format xgrammar reads as EBNF):
//
//   root   ::= answer | "none"          # a rule: a name, ::=, alternatives separated by |
//   answer ::= "yes: " [a-z]+ ("," ws [a-z]+)*
//   ws     ::= [ \t\n]*
//
//   "text"        a literal: the UTF-8 bytes of its characters
//   [a-z0-9_] [^"\\]   one character (code point) in / not in the set; `-` first or last and `]`
//                 escaped are literals
//   .             any one character
//   name          another rule (defined anywhere in the text, before or after)
//   ( ... )       a group of alternatives
//   x* x+ x?      repetition of the item before; x{m} x{m,} x{m,n} with counts <= kMaxRepeat
//   # ...         a comment to the end of the line
// Escapes in literals and classes: \n \r \t \f \v \0 \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH (a code
// point, as in llama.cpp: "\xe9" is é, bytes C3 A9) and `\` before any ASCII punctuation.
// Rule names are letters, digits, '-' and '_'. A rule may span lines; it ends where the next
// `name ::=` begins. The start rule is `root` unless parse() is told otherwise. Not supported
// (kUnsupported): llama.cpp's token references <[id]> / <|token|> and their negation `!`.
//
// parse() refuses, naming the rule, what the engine could not serve exactly:
//   - a rule used but never defined; a rule defined twice; no start rule;
//   - a rule that can never finish (every alternative needs the rule itself again, or a class
//     that matches nothing): its text would be a dead end, and a guided step must always be
//     able to reach a whole match from any text it allowed;
//   - left recursion (`list ::= list "," item | item`): a rule that can come back to itself
//     before reading a byte, other than in the last place of an alternative (`x* ::= x x* |`,
//     which needs no growing stack). llama.cpp refuses it too; write it as repetition.
// Errors name the line and column.
//
// The compiled grammar is flat, for grammar_dfa.h: every rule's alternatives are runs of
// elements (a byte range, or a reference to a rule) closed by an end element, back to back in
// one array, so that a position in it (an int32) says where a parse is.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace lragent::guide {

class Grammar {
 public:
  static constexpr int kMaxRepeat = 1000;            // largest count in {m,n}
  static constexpr size_t kMaxElements = 1u << 20;   // the flat array's size cap
  static constexpr int kMaxDepth = 200;              // nested groups

  struct Element {
    enum Kind : uint8_t { kBytes, kRule, kEnd };
    Kind kind = kEnd;
    uint8_t lo = 0, hi = 0;  // kBytes: one byte in [lo, hi]
    int32_t rule = -1;       // kRule
  };

  static Result<std::unique_ptr<Grammar>> parse(std::string_view text, std::string_view root = "root");

  const std::vector<Element>& elements() const { return elements_; }
  // The positions where rule r's alternatives start.
  std::span<const int32_t> alternatives(int32_t rule) const {
    const auto r = static_cast<size_t>(rule);
    return std::span<const int32_t>(alt_start_).subspan(alt_begin_[r], alt_begin_[r + 1] - alt_begin_[r]);
  }
  int32_t root() const { return root_; }
  size_t rules() const { return names_.size(); }
  // A rule's name; a group or repetition gets its rule's name and a number ("root-2").
  const std::string& name(int32_t rule) const { return names_[static_cast<size_t>(rule)]; }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;  // [elements] every alternative, each closed by kEnd
  std::vector<int32_t> alt_start_; // [alternatives] position of each alternative's first element
  std::vector<uint32_t> alt_begin_;  // [rules + 1] rule r's alternatives: alt_start_[begin[r] .. begin[r + 1])
  std::vector<std::string> names_;   // [rules]
  int32_t root_ = -1;
};

// A GBNF grammar whose start rule reads a thinking model's reasoning first: an optional
// "<think>", any text without "</think>", "</think>", whitespace, then `root` (reasoning.h's
// after_reasoning for grammars). Returns the new text; its start rule's name goes to *new_root
// (which may be the string `root` views).
std::string grammar_after_reasoning(std::string_view gbnf, std::string_view root, std::string* new_root);

}  // namespace lragent::guide

namespace lragent::guide {

// vLLM takes a guided grammar with no "::=" in it as Lark's syntax and converts it to GBNF
// (convert_lark_to_ebnf). The same test here (comments, `#` or `//`, left out).
bool looks_like_lark(std::string_view text);

// Lark's grammar syntax (lark-parser.readthedocs.io, "Grammar Reference") as GBNF:
//   name: alternatives        a rule (a leading ? or !, and a .priority, dropped); terminals
//                             (NAME: ...) are rules too
//   | more                    a line starting with | adds alternatives to the rule above
//   "text" 'text'             literals; "a".."z" a range of characters
//   [x]  x?  x*  x+           [x] is optional (Lark's meaning, not a character class)
//   x ~ 3   x ~ 2..5          repetition
//   -> alias                  dropped (it names a tree node)
//   // and # comments
// The start rule is `start` when there is one, else the first rule (vLLM's choice); its name
// goes to *root. Refused, kUnsupported with the line: regular expressions /.../, directives
// (%import, %ignore, %declare, ...), literal flags ("x"i), templates. Other malformed lines are
// kInvalidArgument with the line. The GBNF then goes through Grammar::parse like any other.
Result<std::string> lark_to_gbnf(std::string_view lark, std::string* root);

}  // namespace lragent::guide
