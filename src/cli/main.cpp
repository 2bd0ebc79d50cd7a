// rlx: the command-line entry point.
#include <iostream>

#include "commands.hpp"
#include "rlx/core/error.hpp"
#include "rlx/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"rlx: reinforcement-learning post-training of language models, natively", "rlx"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("rlx ") + rlx::kVersion);
  rlx::cli::Action action;
  rlx::cli::add_config_commands(app, action);
  rlx::cli::add_model_commands(app, action);
  rlx::cli::add_inspect_commands(app, action);
  rlx::cli::add_tokenize_command(app, action);
  rlx::cli::add_generate_command(app, action);
  rlx::cli::add_bench_commands(app, action);
  rlx::cli::add_bus_commands(app, action);
  rlx::cli::add_env_commands(app, action);
  rlx::cli::add_learner_commands(app, action);
  rlx::cli::add_run_commands(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return rlx::cli::kExitUsage;
  }
  try {
    return action ? action() : 0;
  } catch (const rlx::ConfigError& e) {
    std::cerr << "rlx: " << e.what() << "\n";
    return rlx::cli::kExitUsage;
  } catch (const rlx::Error& e) {
    std::cerr << "rlx: error: " << e.what() << "\n";
    return rlx::cli::kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "rlx: unexpected error: " << e.what() << "\n";
    return rlx::cli::kExitFailure;
  }
}
