// rlx config show CONFIG [key=value ...]   resolved YAML, or the errors (exit 2)
// rlx config doc                           every key as a markdown table (docs/CONFIG.md)
#include <iostream>

#include "commands.hpp"
#include "rlx/launch/config.hpp"

namespace rlx::cli {

void add_config_commands(CLI::App& app, Action& action) {
  auto* config = app.add_subcommand("config", "Check and show configurations");
  config->require_subcommand(1);

  struct ShowArgs {
    std::string file;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<ShowArgs>();
  auto* show = config->add_subcommand("show", "Print the resolved config as YAML (defaults filled in, overrides applied)");
  show->add_option("config", args->file, "YAML config file")->required();
  show->add_option("overrides", args->overrides, "section.key=value overrides");
  show->callback([args, &action] {
    action = [args] {
      auto cfg = config::load_file<RunConfig>(args->file, args->overrides);
      std::cout << config::to_yaml(cfg);
      return 0;
    };
  });

  auto* doc = config->add_subcommand("doc", "Print every config key as a markdown table");
  doc->callback([&action] {
    action = [] {
      std::cout << config::to_markdown(config::document<RunConfig>());
      return 0;
    };
  });
}

}  // namespace rlx::cli
