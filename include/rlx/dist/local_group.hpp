// Starts the ranks of a group as local processes, as torchrun does on one node:
// it hosts the rendezvous store, starts `world` copies of a command with
// RLX_RANK / RLX_WORLD_SIZE / RLX_STORE set, and watches them. When one rank
// fails, the others are stopped (SIGTERM, then SIGKILL after a grace period)
// instead of being left to hang.
//
//   rlx::dist::LocalGroup g({.world_size = 2, .argv = {"/usr/bin/rlx", "bench", "learner", "--as-rank"}});
//   auto results = g.wait(600);       // per rank: exit code or signal, and its log paths
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rlx/dist/rendezvous.hpp"

namespace rlx::dist {

struct RankExit {
  pid_t pid = -1;
  bool exited = false;  // false: still running (wait timed out) or killed by a signal
  int code = -1;        // exit code when exited
  int signal = 0;       // the signal that ended it, if any
  std::filesystem::path out, err;
  bool ok() const { return exited && code == 0; }
  std::string describe() const;
};

struct LocalGroupOptions {
  int world_size = 1;
  std::vector<std::string> argv;       // the command every rank runs
  std::vector<std::string> env;        // extra NAME=VALUE for every rank
  std::filesystem::path log_dir;       // empty: ranks inherit stdout/stderr; else rank-R.out / rank-R.err
  bool fail_fast = true;               // a failed rank stops the others
  double grace_s = 5;                  // after a rank fails: SIGTERM, then SIGKILL this much later
  // Part of a larger group (one task of a Slurm job): these processes are ranks
  // first_rank .. first_rank + world_size - 1 of group_size, whose store is at `store`
  // (host:port). Empty `store`: this group is the whole group and hosts its store.
  int first_rank = 0;
  int group_size = 0;
  std::string store;
  // Asked when a rank failed (before fail_fast acts): true restarts that rank alone, with
  // the same command and environment (a group that re-forms, ReformableGroup).
  std::function<bool(int rank, const RankExit& how)> replace;
  // The processes start with SIGTERM blocked (besides what the caller blocks): one sent while
  // a process starts waits until it unblocks SIGTERM, its handler installed, instead of
  // killing it before it can say so (a rollout worker).
  bool block_sigterm = false;
};

class LocalGroup {
 public:
  explicit LocalGroup(LocalGroupOptions options);
  ~LocalGroup();  // kills ranks still running
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int store_port() const { return store_.port(); }
  const std::vector<RankExit>& ranks() const { return ranks_; }
  // The rank whose failure stopped the others (fail_fast), -1 while none has.
  int first_failed() const { return first_failed_; }
  // Waits for every rank (at most timeout_s); a failed rank stops the others.
  // Returns the ranks' exits; those still running at the timeout are killed.
  const std::vector<RankExit>& wait(double timeout_s);
  // Polls once; true when every rank has ended.
  bool poll();
  void signal(int rank, int sig);
  // Starts rank `rank` again (it must have ended); its logs go to rank-R.N.out / .err.
  void restart(int rank);
  bool running(int rank) const { return !done_.at(static_cast<size_t>(rank)); }

 private:
  void spawn(int rank);
  LocalGroupOptions opt_;
  StoreServer store_;
  std::vector<std::string> base_env_;
  std::vector<RankExit> ranks_;
  std::vector<int> starts_;  // per rank: how many times it was started
  std::vector<bool> done_;
  double fail_time_ = -1;
  int first_failed_ = -1;
};

}  // namespace rlx::dist
