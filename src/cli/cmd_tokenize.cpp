// `lragent tokenize`: print the ids of a text.
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/synthetic.h"

namespace lragent::cli {
namespace {

struct TokenizeFlags {
  std::string model_dir, text;
  bool json = false, no_special = false;
};

int run_tokenize(const TokenizeFlags& f) {
  std::unique_ptr<Tokenizer> tok;
  if (f.model_dir.empty()) {
    tok = make_byte_tokenizer();
  } else {
    auto t = Tokenizer::load_dir(f.model_dir);
    if (!t.ok()) return report(t.error());
    tok = std::move(*t);
  }
  auto encoded = tok->encode(f.text, !f.no_special);
  if (!encoded.ok()) return report(encoded.error());
  const std::vector<int32_t>& ids = *encoded;
  if (f.json) {
    nlohmann::json j;
    j["ids"] = ids;
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(tok->id_to_token(id));
    j["tokens"] = pieces;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}\n", fmt::join(ids, " "));
  }
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, std::function<int()>& action) {
  static TokenizeFlags flags;
  TokenizeFlags* f = &flags;
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("--model", f->model_dir, "Model directory with tokenizer.json (omitted: the synthetic byte tokenizer)");
  cmd->add_option("--text", f->text, "Text to tokenize")->required();
  cmd->add_flag("--json", f->json, "Print {\"ids\": [...], \"tokens\": [...]}");
  cmd->add_flag("--no-special", f->no_special, "Do not add BOS/EOS special tokens");
  cmd->callback([f, &action] { action = [f] { return run_tokenize(*f); }; });
}

}  // namespace lragent::cli
