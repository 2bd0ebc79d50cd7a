// rlx run CONFIG [key=value ...]    validate the config, then start and watch every role
// rlx role NAME --config F ...      one role of a run (what `rlx run` starts; internal)
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "rlx/launch/roles.hpp"

namespace rlx::cli {

namespace {
// The whole config, checked before any process starts.
void validate_run_config(const RunConfig& cfg) {
  cfg.model.validate();
  cfg.learner.validate();
  cfg.algorithm.validate();
  // Placement: every learner rank trains at least one group of a step.
  if (cfg.train.learner_ranks > cfg.train.groups_per_step)
    throw ConfigError(fmt::format("train.learner_ranks = {}: more learner ranks than train.groups_per_step = {}",
                                  cfg.train.learner_ranks, cfg.train.groups_per_step));
}
}  // namespace

void add_run_commands(CLI::App& app, Action& action) {
  struct RunArgs {
    std::string file;
    std::vector<std::string> overrides;
    launch::LaunchOptions launch;
  };
  auto args = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "Train: validate CONFIG, then start the hub, learner and rollout workers and watch them");
  run->add_option("config", args->file, "YAML run config")->required();
  run->add_option("overrides", args->overrides, "section.key=value overrides");
  run->add_flag("--resume", args->launch.resume, "continue the run directory from its newest checkpoint");
  run->add_flag("--force", args->launch.force, "start over in a run directory that holds a run (deletes it)");
  run->callback([args, &action] {
    action = [args] {
      // The whole config is checked before any process starts.
      auto cfg = config::load_file<RunConfig>(args->file, args->overrides);
      validate_run_config(cfg);
      return launch::launch(cfg, std::filesystem::read_symlink("/proc/self/exe").string(), args->launch);
    };
  });

  auto sft_args = std::make_shared<RunArgs>();
  auto* sft = app.add_subcommand("sft", "Warm-start CONFIG's model with SFT on its environment's tasks (writes RUN_DIR/final)");
  sft->add_option("config", sft_args->file, "YAML run config (sections sft, env, model)")->required();
  sft->add_option("overrides", sft_args->overrides, "section.key=value overrides");
  sft->callback([sft_args, &action] {
    action = [sft_args] { return launch::run_sft(config::load_file<RunConfig>(sft_args->file, sft_args->overrides)); };
  });
  auto eval_args = std::make_shared<RunArgs>();
  auto* ev = app.add_subcommand("eval", "Greedy held-out accuracy of CONFIG's model (model.path=DIR) on its environment");
  ev->add_option("config", eval_args->file, "YAML run config")->required();
  ev->add_option("overrides", eval_args->overrides, "section.key=value overrides");
  ev->callback([eval_args, &action] {
    action = [eval_args] {
      const auto cfg = config::load_file<RunConfig>(eval_args->file, eval_args->overrides);
      std::cout << nlohmann::json{{"accuracy", launch::evaluate(cfg)}, {"tasks", cfg.sft.eval_tasks},
                                  {"model", cfg.model.path.empty() ? cfg.model.preset : cfg.model.path}}
                       .dump()
                << std::endl;
      return 0;
    };
  });

  struct ScaleArgs {
    std::string run_dir;
    uint32_t workers = 0;
  };
  auto sc = std::make_shared<ScaleArgs>();
  auto* scale = app.add_subcommand("scale", "Change the number of rollout workers of a running `rlx run`");
  scale->add_option("run_dir", sc->run_dir, "the run directory (run.out_dir/run.name)")->required();
  scale->add_option("--workers", sc->workers, "rollout workers wanted (1 to 1024)")->required();
  scale->callback([sc, &action] {
    action = [sc] {
      launch::scale(sc->run_dir, sc->workers);
      std::cerr << fmt::format("rlx scale: {} asked for {} rollout workers", sc->run_dir, sc->workers) << std::endl;
      return 0;
    };
  });

  struct K8sArgs {
    std::string file;
    std::vector<std::string> overrides;
    launch::K8sOptions k8s;
  };
  auto ka = std::make_shared<K8sArgs>();
  auto* k8s = app.add_subcommand("k8s", "Kubernetes manifests of a run")->require_subcommand(1);
  auto* render = k8s->add_subcommand("render", "Print a headless Service, a ConfigMap and an Indexed Job that run CONFIG's plan");
  render->add_option("config", ka->file, "YAML run config")->required();
  render->add_option("overrides", ka->overrides, "section.key=value overrides");
  render->add_option("--image", ka->k8s.image, "container image with rlx on its PATH")->capture_default_str();
  render->add_option("--namespace", ka->k8s.namespace_, "namespace of the objects (default: the current one)");
  render->add_option("--host-path", ka->k8s.host_path, "the node's directory of run directories")->capture_default_str();
  render->add_option("--claim", ka->k8s.claim, "a ReadWriteMany PersistentVolumeClaim for the run directories instead");
  render->add_flag("--resume", ka->k8s.resume, "the pods continue the run from its last checkpoint");
  render->callback([ka, &action] {
    action = [ka] {
      auto cfg = config::load_file<RunConfig>(ka->file, ka->overrides);
      validate_run_config(cfg);
      std::cout << launch::render_k8s(cfg, ka->k8s);
      return 0;
    };
  });

  struct RoleArgs {
    std::string role, config, run_dir, weights, exe;
    int index = 0;
  };
  auto ra = std::make_shared<RoleArgs>();
  auto* role = app.add_subcommand("role", "One role of a run, as `rlx run` starts it")->group("");
  role->add_option("role", ra->role, "hub, learner or worker")->required()->check(CLI::IsMember({"hub", "learner", "worker"}));
  role->add_option("--config", ra->config, "the run's resolved config")->required();
  role->add_option("--run-dir", ra->run_dir, "the run directory")->required();
  role->add_option("--weights", ra->weights, "the weight-sync segment")->required();
  role->add_option("--exe", ra->exe, "the rlx binary")->required();
  role->add_option("--index", ra->index, "worker index")->required();
  role->callback([ra, &action] {
    action = [ra] {
      // A role dies with its launcher (SIGTERM: the learner checkpoints, the hub saves).
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (const char* p = std::getenv("RLX_LAUNCHER_PID"); p && ::getppid() != std::atoi(p)) return 1;
      launch::RoleContext ctx{.cfg = config::load_file<RunConfig>(ra->config), .run_dir = ra->run_dir, .weights = ra->weights, .exe = ra->exe};
      ctx.index = ra->role == "learner" && std::getenv("RLX_RANK") ? std::atoi(std::getenv("RLX_RANK")) : ra->index;
      launch::start_heartbeat(ctx.run_dir, ra->role, ctx.index);
      launch::start_trace(ctx, ra->role);
      if (ra->role == "hub") return launch::run_hub(ctx);
      if (ra->role == "learner") return launch::run_learner(ctx);
      return launch::run_worker(ctx);
    };
  });
}

}  // namespace rlx::cli
