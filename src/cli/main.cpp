// lragent command-line entry point: the only place that turns errors into exit codes.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "cli/commands.h"
#include "cli/config_flag.h"

int main(int argc, char** argv) {
  CLI::App app{
      "lragent: an inference engine for multi-agent LLM systems whose agents are LoRA adapters on one base model.\n"
      "The base KV cache is shared across agents; each adapter's contribution is kept in low-rank form."};
  app.require_subcommand(1);
  app.footer(
      "\nExamples:\n"
      "  lragent demo                                   all five sharing modes on the built-in model\n"
      "  lragent generate --model DIR --prompt TEXT     greedy continuation (add --json --logits for scripts)\n"
      "  lragent replay --model DIR --adapter plan=DIR --adapter action=DIR --kv-share base-lr --script S.json\n"
      "  lragent run --workflow react --model DIR --adapter plan=P --adapter action=A --adapter reflect=R\n"
      "  lragent serve --model DIR --adapter plan=P --adapter action=A --port 8000   OpenAI-compatible server\n"
      "  lragent run-batch -i requests.jsonl -o answers.jsonl --model DIR   a file of API requests, offline\n"
      "  lragent bench trace --device cuda --preset llama3.1-8b   the poster's trace benchmark, all modes\n"
      "Run `lragent COMMAND --help` for every flag of a command; every command reads its flags from a YAML\n"
      "file too (--config FILE, as vLLM's: `port: 8000`, one flag a line, the command line winning).\n"
      "Exit codes: 1 input/output failure (e.g. an unwritable output file) or internal error, 2 bad argument,\n"
      "3 not found, 4 corrupt file, 5 unsupported, 6 out of memory (KV cache or allocation).");
  app.set_version_flag("--version", "lragent " LRAGENT_VERSION);
  std::function<int()> action;
  lragent::cli::register_generate(app, action);
  lragent::cli::register_tokenize(app, action);
  lragent::cli::register_replay(app, action);
  lragent::cli::register_fidelity(app, action);
  lragent::cli::register_run(app, action);
  lragent::cli::register_demo(app, action);
  lragent::cli::register_bench(app, action);
  lragent::cli::register_serve(app, action);
  lragent::cli::register_run_batch(app, action);
  lragent::cli::add_config_flag(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints the message (or the help); every bad flag is exit code 2, as the footer says
    // (CLI11's own codes, e.g. 105 for a value outside a set, are not part of lragent's contract).
    const int code = app.exit(e);
    return code == static_cast<int>(CLI::ExitCodes::Success) ? 0 : 2;
  }
  // Library code returns errors; what still escapes (the host running out of memory outside a
  // forward pass, a system error) ends the command with a message instead of std::terminate.
  int code = 0;
  try {
    code = action ? action() : 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory; use a smaller model, context or batch\n");
    code = 6;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: internal error: %s\n", e.what());
    code = 1;
  }
  // Output that never reached stdout (a full disk, a broken device) fails the command: a script
  // reading `--json > out.json` must not take a truncated file for the answer.
  const bool flushed = std::fflush(stdout) == 0;
  const int flush_errno = errno;
  if (!flushed || std::ferror(stdout)) {
    std::fprintf(stderr, "error: cannot write the output to stdout%s%s\n", flushed ? "" : ": ",
                 flushed ? "" : std::strerror(flush_errno));
    return code != 0 ? code : 1;
  }
  return code;
}
