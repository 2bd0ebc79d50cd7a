// rlx: the command-line entry point (the trainer commands with every bundled part, and the tools).
#include "commands.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/version.hpp"

int main(int argc, char** argv) {
  rlx::prepare_blas(argv);  // may re-execute this process once
  rlx::report_crashes();    // a SIGSEGV prints its stack to the log before the process ends
  CLI::App app{"rlx: reinforcement-learning post-training of language models, natively", "rlx"};
  app.require_subcommand(1);
  // The OpenBLAS kernels in use on a second line: scripts/test.sh exports them once, so the
  // suite's thousand rlx processes skip the re-execution above.
  const std::string blas = rlx::blas_core_name();
  app.set_version_flag("--version",
                       std::string("rlx ") + rlx::kVersion + (blas.empty() ? "" : "\nOpenBLAS core: " + blas));
  rlx::cli::Action action;
  rlx::launch::add_trainer_commands(app, action);  // run, sft, eval, scale, k8s, role, env serve
  rlx::cli::add_config_commands(app, action);
  rlx::cli::add_model_commands(app, action);
  rlx::cli::add_inspect_commands(app, action);
  rlx::cli::add_tokenize_command(app, action);
  rlx::cli::add_chat_commands(app, action);
  rlx::cli::add_serve_command(app, action);
  rlx::cli::add_generate_command(app, action);
  rlx::cli::add_bench_commands(app, action);
  rlx::cli::add_bus_commands(app, action);
  rlx::cli::add_env_commands(app, action);  // after add_trainer_commands: adds to its `env` group
  rlx::cli::add_learner_commands(app, action);
  rlx::cli::add_sync_bench(app, action);
  return rlx::cli::run_app(app, argc, argv, action);
}
