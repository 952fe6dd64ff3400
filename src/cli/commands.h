// Each CLI subcommand registers its flags and, when chosen, sets `action` to run it.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace lragent::cli {

void register_generate(CLI::App& app, std::function<int()>& action);
void register_tokenize(CLI::App& app, std::function<int()>& action);
void register_replay(CLI::App& app, std::function<int()>& action);
void register_fidelity(CLI::App& app, std::function<int()>& action);
void register_run(CLI::App& app, std::function<int()>& action);
void register_demo(CLI::App& app, std::function<int()>& action);
void register_bench(CLI::App& app, std::function<int()>& action);  // `bench trace`
void register_serve(CLI::App& app, std::function<int()>& action);
void register_run_batch(CLI::App& app, std::function<int()>& action);

}  // namespace lragent::cli
