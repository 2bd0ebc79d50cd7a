// The run directory's setup and end for `rlx run` (both backends): preflight checks, the
// directory prepared (or resumed), plots and the merged trace at the end; `rlx scale`.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "core/build_paths.hpp"
#include "launch_common.hpp"
#include "rlx/core/files.hpp"
#include "rlx/dist/local_group.hpp"
#include "rlx/launch/launcher.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/model/hf.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;

// The trial start of an env server before a run (it loads the binary and the environment).
constexpr double kEnvCheckS = 60;

void scale(const fs::path& dir, uint32_t workers) {
  RLX_CHECK(workers <= 1024, "rlx scale: {} workers; 0 (rollout paused) to 1024 can run", workers);
  const RunDir run_dir(dir);
  const auto pid_file = run_dir.launcher_pid();
  RLX_CHECK(fs::exists(pid_file), "rlx scale: {} is not a run directory (no {})", run_dir.string(),
            pid_file.filename().string());
  const auto pid = std::atoi(read_file(pid_file, 64).c_str());
  RLX_CHECK(pid > 0 && ::kill(pid, 0) == 0, "rlx scale: the run in {} is not running (launcher pid {})", run_dir.string(), pid);
  run_dir.request_workers(workers);
}

namespace {

// The plotting script: $RLX_PLOT_SCRIPT, else the source tree's, else the installed one.
fs::path plot_script() {
  if (const char* env = std::getenv("RLX_PLOT_SCRIPT")) return env;
  for (const char* path : {build_paths::kPlotScriptSource, build_paths::kPlotScriptInstall})
    if (::access(path, R_OK) == 0) return path;
  return {};
}

// PNG curves of metrics.jsonl in run_dir/plots, by scripts/plot_metrics.py under Debian's
// python3 (it has python3-matplotlib). Bounded to 120 s; a failure is reported, not fatal.
void write_plots(const RunDir& run_dir) {
  const fs::path script = plot_script();
  if (script.empty()) {
    std::cerr << "rlx run: no plots: plot_metrics.py not found (set RLX_PLOT_SCRIPT)" << std::endl;
    return;
  }
  const std::string python = ::access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  dist::LocalGroup plot({.argv = {python, script.string(), run_dir.string()}, .log_dir = run_dir.plot_logs()});
  const auto& e = plot.wait(120).front();
  if (e.ok())
    std::cerr << fmt::format("rlx run: plots {}", run_dir.plots().string()) << std::endl;
  else
    std::cerr << fmt::format("rlx run: no plots: {} {} (see {})", script.string(), e.describe(), e.err.string()) << std::endl;
}

}  // namespace

// What `rlx run` checks before it writes the run directory or starts anything
// (run.preflight): "" or the first problem, naming the file, path or key.
std::string preflight_files(const RunConfig& cfg) {
  const auto run_dir = RunDir::of(cfg);
  // The run directory can be written.
  try {
    fs::create_directories(run_dir.root());
    const auto probe = run_dir.write_probe(::getpid());
    write_file_atomic(probe, "probe\n");
    fs::remove(probe);
  } catch (const std::exception& e) {
    return fmt::format("the run directory {} cannot be written (run.out_dir, run.name): {}", run_dir.string(), e.what());
  }
  // The model's and the tokenizer's files can be read.
  try {
    if (!cfg.model.path.empty()) {
      const fs::path dir = cfg.model.path;
      (void)read_hf_config(dir);
      size_t weights = 0;
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".safetensors") continue;
        ++weights;
        std::ifstream in(e.path(), std::ios::binary);
        char magic[8];
        if (!in.read(magic, sizeof magic)) return fmt::format("model.path: {} cannot be read", e.path().string());
      }
      if (weights == 0) return fmt::format("model.path: {} holds no *.safetensors file", dir.string());
    }
    (void)run_tokenizer(cfg);
  } catch (const std::exception& e) {
    return fmt::format("model or tokenizer: {}", e.what());
  }
  return "";
}

// The trial start of an env server (after the run directory holds the run's tokenizer).
std::string preflight_env(const RunConfig& cfg, const RunDir& run_dir, const std::string& exe) {
  if (cfg.env.servers == 0) return "";
  const RoleContext ctx{.cfg = cfg, .run_dir = run_dir, .exe = exe};
  const auto why = check_env_server(ctx, kEnvCheckS);
  return why.empty() ? "" : fmt::format("the env server does not start in its sandbox (env.sandbox): {}", why);
}

void resume_run(const RunDir& run_dir) {
  if (const auto step = run_dir.prepare_resume(); step > 0)
    std::cerr << fmt::format("rlx run: resuming {} at step {}", run_dir.string(), step) << std::endl;
}

RunDir prepare_run_dir(const RunConfig& cfg, const LaunchOptions& lo) {
  const auto run_dir = RunDir::of(cfg);
  fs::create_directories(run_dir.logs());
  if (lo.resume) {
    resume_run(run_dir);
  } else if (run_dir.holds_run()) {
    RLX_CHECK(lo.force, "run directory {} holds a run: --resume continues it, --force starts it over", run_dir.string());
    run_dir.clear();
  }
  write_file_atomic(run_dir.config(), config::to_yaml(cfg));
  // Env servers load the run's tokenizer from the run directory.
  write_tokenizer(cfg, run_dir.tokenizer());
  write_file_atomic(run_dir.launcher_pid(), fmt::format("{}\n", ::getpid()));  // for `rlx scale`
  return run_dir;
}

void finish_run(const RunConfig& cfg, const RunDir& run_dir) {
  if (cfg.run.plots) write_plots(run_dir);
  if (!cfg.trace.enabled) return;
  const auto events = merge_traces(run_dir);
  std::cerr << fmt::format("rlx run: trace {} ({} events; ui.perfetto.dev opens it)", run_dir.merged_trace().string(), events)
            << std::endl;
}


}  // namespace rlx::launch
