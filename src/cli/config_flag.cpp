#include "cli/config_flag.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iterator>
#include <memory>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "core/config_file.h"

namespace lragent::cli {
namespace {

constexpr const char* kHelp =
    "Read flags from a YAML file, as vLLM's --config: one `flag-name: value` a line (the long name "
    "without \"--\"; a list as [a, b] or one \"- item\" a line; a JSON value as {...}). A flag on the "
    "command line wins over the file's";

// The command that runs: the last of the parsed subcommands' chain.
std::vector<const CLI::App*> command_chain(const CLI::App* root) {
  std::vector<const CLI::App*> chain;
  for (const CLI::App* a = root;;) {
    const std::vector<CLI::App*> subs = a->get_subcommands();
    if (subs.empty()) return chain;
    a = subs.front();
    chain.push_back(a);
  }
}

class YamlFlags : public CLI::Config {
 public:
  YamlFlags(const CLI::App* root, std::string path) : root_(root), path_(std::move(path)) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    const std::string text(std::istreambuf_iterator<char>(in), {});
    auto entries = parse_config_file(text, path_);
    if (!entries.ok()) throw CLI::ConfigError(entries.error().message);
    const std::vector<const CLI::App*> chain = command_chain(root_);
    if (chain.empty()) return {};
    const CLI::App* cmd = chain.back();
    std::vector<std::string> names;
    for (const CLI::App* a : chain) names.push_back(a->get_name());
    const std::string command = fmt::format("lragent {}", fmt::join(names, " "));
    std::vector<CLI::ConfigItem> items;
    for (ConfigEntry& e : *entries) {
      if (e.key == "config")
        throw CLI::ConfigError(fmt::format("{}, line {}: a config file cannot name another", path_, e.line));
      const CLI::Option* opt = cmd->get_option_no_throw("--" + e.key);
      if (!opt)
        throw CLI::ConfigError(fmt::format("{}, line {}: '{}' is not a flag of `{}` (see `{} --help`)", path_, e.line,
                                           e.key, command, command));
      if (e.list && e.values.empty()) continue;  // [] gives no value: the flag's default
      CLI::ConfigItem item;
      item.parents = names;
      item.name = e.key;
      item.inputs = std::move(e.values);
      items.push_back(std::move(item));
    }
    return items;
  }

  // The flags given, as a file this class reads (CLI11's App::config_to_str).
  std::string to_config(const CLI::App* app, bool, bool, std::string) const override {
    std::string out;
    for (const CLI::Option* opt : app->get_options()) {
      if (opt->count() == 0 || !opt->get_configurable() || opt->get_lnames().empty()) continue;
      std::vector<std::string> quoted;  // JSON strings: YAML double-quoted scalars
      for (const std::string& v : opt->results())
        quoted.push_back(nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      out += opt->get_lnames().front() + ": ";
      out += quoted.size() == 1 ? quoted.front() : fmt::format("[{}]", fmt::join(quoted, ", "));
      out += "\n";
    }
    return out;
  }

 private:
  const CLI::App* root_;
  std::string path_;
};

void add_to_commands(CLI::App* app, std::string* storage) {
  for (CLI::App* sub : app->get_subcommands({})) {
    sub->add_option("--config", *storage, kHelp)->check(CLI::ExistingFile)->configurable(false);
    add_to_commands(sub, storage);
  }
}

}  // namespace

void add_config_flag(CLI::App& app, int argc, char** argv) {
  static std::string given;  // what the commands' --config took (the file is read below)
  add_to_commands(&app, &given);
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--config" && i + 1 < argc) path = argv[i + 1];
    if (a.substr(0, 9) == "--config=") path = std::string(a.substr(9));
  }
  if (path.empty()) return;
  app.set_config("--config-file", path, "", /*config_required=*/true)->group("");
  app.config_formatter(std::make_shared<YamlFlags>(&app, path));
}

}  // namespace lragent::cli
