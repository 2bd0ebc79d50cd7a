// Fault injection: the variables' forms, their errors, which sites a fault fires at, once
// files, and a real SIGKILL in a child process.
#include "rlx/core/fault.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <utility>
#include <string>

#include "../helpers.hpp"

using Catch::Matchers::Contains;
using rlx::fault::Point;

namespace {

// Sets the fault variables named (every other one unset) for the scope, then unsets them all.
struct FaultEnv {
  FaultEnv(std::initializer_list<std::pair<std::string, std::string>> values) {
    for (const char* v : rlx::fault::kVariables) ::unsetenv(v);
    for (const auto& [k, v] : values) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~FaultEnv() {
    for (const char* v : rlx::fault::kVariables) ::unsetenv(v);
  }
};

}  // namespace

TEST_CASE("fault: each variable's form parses to a fault at its named point", "[core][fault]") {
  {
    FaultEnv env{{"RLX_FAULT", "slow-start:learner:4"}};
    const auto f = rlx::fault::from_env();
    REQUIRE(f.size() == 1);
    CHECK(f[0].point == Point::slow_start);
    CHECK(f[0].role == "learner");
    CHECK(f[0].rank == 0);
    CHECK(f[0].seconds == 4.0);
  }
  {
    FaultEnv env{{"RLX_FAULT", "kill-after-episode-checkpoint:1:3"}};
    const auto f = rlx::fault::from_env();
    REQUIRE(f.size() == 1);
    CHECK(f[0].point == Point::kill_after_episode_checkpoint);
    CHECK(f[0].rank == 1);
    CHECK(f[0].after == 3);
  }
  {
    FaultEnv env{{"RLX_CHECKPOINT_CRASH_AT", "shards-agreed"},
                  {"RLX_CHECKPOINT_CRASH_RANK", "1"},
                  {"RLX_CHECKPOINT_CRASH_STEP", "4"},
                  {"RLX_CHECKPOINT_CRASH_ONCE", "/tmp/x.crashed"},
                  {"RLX_COMM_CRASH", "1:23:layers.1 gradients: a"}};
    const auto f = rlx::fault::from_env();
    REQUIRE(f.size() == 2);
    CHECK(f[0].point == Point::checkpoint_shards_agreed);
    CHECK(f[0].rank == 1);
    CHECK(f[0].step == 4);
    CHECK(f[0].once_file == "/tmp/x.crashed");
    CHECK(f[1].point == Point::collective);
    CHECK(f[1].rank == 1);
    CHECK(f[1].nth == 23);
    CHECK(f[1].what == "layers.1 gradients: a");  // the description keeps its colons
    CHECK(f[1].once_file.empty());
  }
  {
    FaultEnv env{};
    CHECK(rlx::fault::from_env().empty());
    CHECK_FALSE(rlx::fault::armed(Point::collective));
    CHECK_FALSE(rlx::fault::fires(Point::collective, {.what = "x"}));
  }
}

TEST_CASE("fault: an unknown point names the known ones; a malformed value names the form", "[core][fault]") {
  {
    FaultEnv env{{"RLX_FAULT", "slow-stop:3"}};
    const auto e = rlx::test::error_of([] { rlx::fault::from_env(); });
    CHECK_THAT(e, Contains("RLX_FAULT=slow-stop:3: unknown fault point 'slow-stop'"));
    CHECK_THAT(e, Contains("known: slow-start, slow-checkpoint, kill-after-episode-checkpoint"));
  }
  {
    FaultEnv env{{"RLX_CHECKPOINT_CRASH_AT", "manifests"}};
    CHECK_THAT(rlx::test::error_of([] { rlx::fault::armed(Point::collective); }),
               Contains("unknown fault point 'manifests' (known: shards, shards-agreed, manifest, renamed)"));
  }
  for (const char* bad : {"slow-checkpoint:700", "slow-checkpoint:", "slow-start:learner", "slow-start:Learner:2",
                          "kill-after-episode-checkpoint:-1:3", "kill-after-episode-checkpoint:0:3x"}) {
    FaultEnv env{{"RLX_FAULT", bad}};
    CHECK_THAT(rlx::test::error_of([] { rlx::fault::from_env(); }), Contains("expected slow-start:ROLE:SECONDS"));
  }
  for (const char* bad : {"1:x:grad", "1:2", "1:0:grad", "-1:2:grad"}) {
    FaultEnv env{{"RLX_COMM_CRASH", bad}};
    CHECK_THAT(rlx::test::error_of([] { rlx::fault::from_env(); }), Contains("expected RANK:N:WHAT"));
  }
  FaultEnv env{{"RLX_CHECKPOINT_CRASH_AT", "shards"}, {"RLX_CHECKPOINT_CRASH_STEP", "four"}};
  CHECK_THAT(rlx::test::error_of([] { rlx::fault::from_env(); }), Contains("RLX_CHECKPOINT_CRASH_STEP=four"));
}

TEST_CASE("fault: a fault fires where its rank, step and description match, at its nth match, once", "[core][fault]") {
  rlx::test::TempDir dir;
  const auto once = dir / "comm.crashed";
  {
    FaultEnv env{{"RLX_COMM_CRASH", "1:2:gradients"}, {"RLX_COMM_CRASH_ONCE", once.string()}};
    CHECK(rlx::fault::armed(Point::collective));
    CHECK_FALSE(rlx::fault::armed(Point::checkpoint_shards));
    CHECK_FALSE(rlx::fault::fires(Point::collective, {.rank = 0, .what = "layers.1 gradients"}));  // another rank
    CHECK_FALSE(rlx::fault::fires(Point::collective, {.rank = 1, .what = "parameters"}));         // not a match
    CHECK_FALSE(rlx::fault::fires(Point::collective, {.rank = 1, .what = "layers.0 gradients"}));  // the 1st match
    CHECK_FALSE(std::filesystem::exists(once));
    CHECK(rlx::fault::fires(Point::collective, {.rank = 1, .what = "layers.1 gradients"}));  // the 2nd
    CHECK(rlx::test::read_file(once) == "collective\n");
    CHECK_FALSE(rlx::fault::fires(Point::collective, {.rank = 1, .what = "layers.2 gradients"}));  // the 3rd
  }
  {  // the restarted process: the once file exists, so it runs on
    FaultEnv env{{"RLX_COMM_CRASH", "1:1:gradients"}, {"RLX_COMM_CRASH_ONCE", once.string()}};
    CHECK_FALSE(rlx::fault::fires(Point::collective, {.rank = 1, .what = "layers.1 gradients"}));
  }
  {  // a checkpoint point: rank 0 by default, any step unless one is named
    FaultEnv env{{"RLX_CHECKPOINT_CRASH_AT", "manifest"}, {"RLX_CHECKPOINT_CRASH_STEP", "4"}};
    CHECK_FALSE(rlx::fault::fires(Point::checkpoint_shards, {.rank = 0, .step = 4}));
    CHECK_FALSE(rlx::fault::fires(Point::checkpoint_manifest, {.rank = 1, .step = 4}));
    CHECK_FALSE(rlx::fault::fires(Point::checkpoint_manifest, {.rank = 0, .step = 2}));
    CHECK(rlx::fault::fires(Point::checkpoint_manifest, {.rank = 0, .step = 4}));
    CHECK(rlx::fault::fires(Point::checkpoint_manifest, {.rank = 0, .step = 4}));  // no once file: every time
  }
  {  // RLX_FAULT: once per run directory, through the site's marker
    const auto marker = dir / "fault-injected";
    FaultEnv env{{"RLX_FAULT", "slow-start:learner:2.5"}};
    CHECK_FALSE(rlx::fault::fires(Point::slow_start, {.rank = 0, .role = "worker", .once_file = marker}));
    CHECK_FALSE(rlx::fault::fires(Point::slow_start, {.rank = 1, .role = "learner", .once_file = marker}));
    const auto f = rlx::fault::fires(Point::slow_start, {.rank = 0, .role = "learner", .once_file = marker});
    REQUIRE(f);
    CHECK(f->seconds == 2.5);
    CHECK(std::filesystem::exists(marker));
    CHECK_FALSE(rlx::fault::fires(Point::slow_start, {.rank = 0, .role = "learner", .once_file = marker}));
  }
  {
    FaultEnv env{{"RLX_FAULT", "kill-after-episode-checkpoint:0:3"}};
    CHECK_FALSE(rlx::fault::fires(Point::kill_after_episode_checkpoint, {.rank = 0, .count = 2}));
    CHECK_FALSE(rlx::fault::fires(Point::kill_after_episode_checkpoint, {.rank = 1, .count = 3}));
    CHECK(rlx::fault::fires(Point::kill_after_episode_checkpoint, {.rank = 0, .count = 3}));
  }
}

TEST_CASE("fault: crash_at kills the process with SIGKILL where the fault fires", "[core][fault]") {
  FaultEnv env{{"RLX_CHECKPOINT_CRASH_AT", "renamed"}, {"RLX_CHECKPOINT_CRASH_RANK", "2"}};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    rlx::fault::crash_at(Point::checkpoint_renamed, {.rank = 1, .step = 3});  // not this rank: goes on
    rlx::fault::crash_at(Point::checkpoint_renamed, {.rank = 2, .step = 3});
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}
