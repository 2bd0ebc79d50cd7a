// What the supervisor's backends share (internal): what a role did (role_watch.cpp), the
// progress line, the run directory and the end of a run (launcher.cpp), the tasks of a
// many-task run (task_runner.cpp).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rlx/core/clock.hpp"
#include "rlx/core/files.hpp"
#include "rlx/dist/local_group.hpp"
#include "rlx/launch/launcher.hpp"
#include "rlx/launch/roles.hpp"
#include "rlx/launch/supervisor.hpp"
#include "rlx/launch/tasks.hpp"
#include "validation_summary.hpp"

namespace rlx::launch {

double wall_now();

// The mtime of a role's heartbeat file (wall clock), -1 when there is none.
double heartbeat_mtime(const RunDir& run_dir, RoleId id);
// How a role's process ended, as the supervisor weighs it: its exit, and its own words on
// why (its failure file, else its last error line).
RoleEnd role_end(const RunDir& run_dir, RoleId id, const dist::RankExit& e);

// The launcher's progress line: the newest step of metrics.jsonl. On a terminal it is
// rewritten in place; otherwise a line is printed every 10 steps and at the last one.
class Progress {
 public:
  // Without a terminal, a line also comes when `every_s` passed since the last one.
  Progress(std::filesystem::path metrics, int64_t steps, double every_s = 30)
      : file_(std::move(metrics)), steps_(steps), every_s_(every_s), tty_(::isatty(2) != 0) {}
  // When the last new step was seen (now_s(); the creation of this object before the first).
  double last_step_at() const { return last_step_at_; }
  int64_t last_step() const { return last_step_; }
  // The last step's metrics line (null before the first).
  const nlohmann::json& last_line() const { return last_line_; }
  void poll() {
    std::ifstream in(file_);
    if (!in) return;
    in.seekg(offset_);
    for (std::string line; std::getline(in, line);) {
      if (in.eof()) break;  // a line still being written
      offset_ += static_cast<std::streamoff>(line.size() + 1);
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("step")) continue;
      show(j);
    }
  }
  ~Progress() {
    if (tty_ && shown_) std::cerr << std::endl;
  }

 private:
  void show(const nlohmann::json& j) {
    const auto step = j.value("step", int64_t{0});
    last_step_ = step;
    last_line_ = j;
    last_step_at_ = now_s();
    const double t = j.value("time_s", 0.0);
    const double eta = step > 0 ? t / static_cast<double>(step) * static_cast<double>(steps_ - step) : 0;
    const auto text = fmt::format("step {}/{}  reward {:.3f}  tokens/s {:.0f}  lag {}  eta {:.0f}s{}", step, steps_,
                                  j.value("reward_mean", 0.0), j.value("tokens_per_s", 0.0), j.value("version_lag", 0), eta,
                                  validation_summary(j));
    if (tty_) std::cerr << "\r" << text << "\x1b[K" << std::flush;
    else if (step % 10 == 0 || step == steps_ || step == 1 || now_s() - printed_at_ >= every_s_)
      std::cerr << "rlx run: " << text << std::endl, printed_at_ = now_s();
    shown_ = true;
  }
  std::filesystem::path file_;
  int64_t steps_;
  double every_s_;
  bool tty_;
  double last_step_at_ = now_s(), printed_at_ = now_s();
  int64_t last_step_ = 0;
  nlohmann::json last_line_;
  bool shown_ = false;
  std::streamoff offset_ = 0;
};

// What `rlx run` checks before it writes the run directory or starts anything
// (run.preflight): "" or the first problem, naming the file, path or key (run_setup.cpp).
std::string preflight_files(const RunConfig& cfg);
// The trial start of an env server (after the run directory holds the run's tokenizer).
std::string preflight_env(const RunConfig& cfg, const RunDir& run_dir, const std::string& exe);
// The run directory, ready for the roles: continued (--resume), refused or cleared when it
// holds a run (--force), with the resolved config and the run's tokenizer written.
RunDir prepare_run_dir(const RunConfig& cfg, const LaunchOptions& lo);
// --resume, and a restart of the run: RunDir::prepare_resume, said on the console.
void resume_run(const RunDir& run_dir);
// The end of a run (done or stopped): plots, and the roles' traces merged into trace.json.
void finish_run(const RunConfig& cfg, const RunDir& run_dir);
// A task of a run started as many (task_runner.cpp).
int launch_task(const RunConfig& cfg, const RoleTask& task, const std::string& exe, const LaunchOptions& lo);

}  // namespace rlx::launch
