#include "rlx/launch/run_dir.hpp"

#include <catch2/catch.hpp>

#include "../helpers.hpp"
#include "../test_models.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/learner/checkpoint.hpp"

namespace fs = std::filesystem;
using rlx::launch::Role;
using rlx::launch::RunDir;

namespace {
void touch(const fs::path& p, const std::string& text = "x\n") {
  fs::create_directories(p.parent_path());
  rlx::test::write_file(p, text);
}
}  // namespace

TEST_CASE("run dir: every name below the root, the roles' files by role and index", "[launch][run_dir]") {
  const RunDir d("/runs/a");
  CHECK(d.metrics() == "/runs/a/metrics.jsonl");
  CHECK(d.config() == "/runs/a/config.yaml");
  CHECK(d.heartbeat(Role::worker, 3) == "/runs/a/heartbeats/worker-3");
  CHECK(d.failure(Role::hub, 0) == "/runs/a/failures/hub-0");
  CHECK(d.role_logs(Role::learner, 1) == "/runs/a/logs/learner-1");
  CHECK(d.role_logs(Role::learner, 1, 1002) == "/runs/a/logs/learner-1.1002");
  CHECK(d.trace(Role::worker, 2, 77) == "/runs/a/traces/worker-2.77.json");
  CHECK(d.worker_stats(4).filename().string().starts_with(RunDir::kWorkerStatsPrefix));
  CHECK(RunDir::hub_state_name(12) == "hub-step_00000012.state");
  CHECK(d.task_files("g").worker_ended(1) == "/runs/a/tasks/g/worker-1-ended");
  CHECK(d.hub_socket() == "/runs/a/hub.sock");  // short enough: the sockets stay in the run directory
  CHECK(d.final_tokenizer().parent_path() == d.final_model());

  rlx::RunConfig cfg;
  cfg.run.out_dir = "/o";
  cfg.run.name = "n";
  CHECK(RunDir::of(cfg).root() == "/o/n");
}

TEST_CASE("run dir: a path too deep for a unix socket puts the sockets under /tmp, one folder per run",
          "[launch][run_dir]") {
  const RunDir deep("/" + std::string(90, 'd') + "/run");
  const auto s = deep.socket_dir();
  CHECK(s != deep.root());
  CHECK(s.parent_path() == fs::temp_directory_path());
  CHECK(s == RunDir(deep.root()).socket_dir());  // the same run: the same folder
  CHECK(s != RunDir("/" + std::string(90, 'e') + "/run").socket_dir());
  CHECK(deep.env_server_dir("worker-1023.1023").string().size() + 9 <= 107);  // + "/env.sock"
}

TEST_CASE("run dir: clear removes a run's files, keeping the logs when asked, and nothing it does not own",
          "[launch][run_dir]") {
  rlx::test::TempDir tmp;
  const RunDir d(tmp.path);
  CHECK_FALSE(d.holds_run());
  touch(d.metrics());
  CHECK(d.holds_run());
  touch(d.hub_state());
  touch(d.checkpoints() / "step_00000001" / "x");
  touch(d.hub_state_file(RunDir::hub_state_name(1)));
  touch(d.heartbeat(Role::hub, 0));
  touch(d.role_logs(Role::hub, 0) / "stderr");
  touch(d.fault_marker());
  touch(d.scale_request());
  touch(d.task_files("g").ready());
  touch(d.env_socket(d.env_server_dir("worker-0.0")));
  touch(tmp.path / "mine.txt");  // a user's file
  CHECK(d.hub_states().size() == 1);

  d.clear(/*logs=*/false);
  CHECK_FALSE(d.holds_run());
  CHECK(d.hub_states().empty());
  CHECK_FALSE(fs::exists(d.heartbeats()));
  CHECK_FALSE(fs::exists(d.tasks()));
  CHECK_FALSE(fs::exists(d.env_sockets()));
  CHECK(fs::exists(d.logs()));
  CHECK(fs::exists(d.fault_marker()));
  CHECK(fs::exists(tmp.path / "mine.txt"));
  d.clear();
  CHECK_FALSE(fs::exists(d.logs()));
  CHECK_FALSE(fs::exists(d.fault_marker()));
  CHECK(fs::exists(tmp.path / "mine.txt"));
}

TEST_CASE("run dir: resume restores the hub state of the newest checkpoint and cuts the metrics after it",
          "[launch][run_dir]") {
  rlx::test::TempDir tmp;
  const RunDir d(tmp.path);
  SECTION("no checkpoint: the run starts over, its logs kept") {
    touch(d.metrics(), "{\"step\":1}\n");
    touch(d.role_logs(Role::learner, 0) / "stderr");
    CHECK(d.prepare_resume() == 0);
    CHECK_FALSE(fs::exists(d.metrics()));
    CHECK(fs::exists(d.logs()));
  }
  SECTION("a checkpoint at run step 2") {
    auto comm = rlx::dist::single_process();
    rlx::Learner l(rlx::test::test_model({}), *comm, {});
    l.init_weights(1);
    const auto name = RunDir::hub_state_name(2);
    touch(d.hub_state_file(name), "saved\n");
    touch(d.hub_state(), "newer\n");
    rlx::save_checkpoint(l, {.root = d.checkpoints()}, {{"hub_state", name}, {"weights_version", 2}});
    touch(d.metrics(), "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
    touch(d.samples(), "{\"step\":3}\n");
    touch(d.episodes() / "e");
    CHECK(d.prepare_resume() == 2);
    CHECK(rlx::test::read_file(d.hub_state()) == "saved\n");
    CHECK(rlx::test::read_file(d.metrics()) == "{\"step\":1}\n{\"step\":2}\n");
    CHECK(rlx::test::read_file(d.samples()).empty());
    CHECK_FALSE(fs::exists(d.episodes()));
  }
}

TEST_CASE("run dir: one launcher at a time, and rlx scale's request read back", "[launch][run_dir]") {
  rlx::test::TempDir tmp;
  const RunDir d(tmp.path / "run");
  {
    auto lock = d.lock();
    const auto why = rlx::test::error_of([&] { (void)d.lock(); });
    CHECK(why.find("in use by another launcher") != std::string::npos);
  }
  (void)d.lock();  // released with the first
  CHECK(d.scaled_workers(3) == 3);
  d.request_workers(5);
  CHECK(d.scaled_workers(3) == 5);
  touch(d.scale_request(), "{\"workers\": 5000}\n");
  CHECK(d.scaled_workers(3) == 3);
}
