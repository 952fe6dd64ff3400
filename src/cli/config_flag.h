// `--config FILE` on every command, as vLLM's `vllm serve --config config.yaml`: a YAML file of
// the command's flags (core/config_file.h), read by CLI11 as the config file of the command run,
// so a flag given on the command line wins over the file's, and a required flag may come from it.
#pragma once

#include <CLI/CLI.hpp>

namespace lragent::cli {

// Gives every command of `app` (registered already) a --config flag, and `app` the reader of the
// file it names in `argv` (found before parsing: CLI11 reads config files at the top level only).
void add_config_flag(CLI::App& app, int argc, char** argv);

}  // namespace lragent::cli
