// Environment servers as real processes: `rlx env serve` inside `rlx sandbox run`, called
// through RemoteEnv. Killing the server (SIGKILL) mid-episode is recovered transparently
// (restart + reload of the episode's state, the step applied once); without a supervisor the
// call ends as an InfraError, never as a reward.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "../helpers.hpp"
#include "rlx/bus/message.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/server.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kTokenizer = fs::path(rlx::test_paths::kFixtureDir) / "gpt2" / "tokenizer.json";

rlx::env::EnvServerProcess::Options server_options(const rlx::test::TempDir& dir) {
  rlx::env::EnvServerProcess::Options o;
  o.rlx = rlx::test_paths::kCli;
  o.argv = {rlx::test_paths::kCli, "env", "serve", "--address", "ipc://" + (dir / "env.sock").string(), "--tokenizer", kTokenizer.string()};
  o.sandbox.limits.wall_s = 600;
  o.sandbox.limits.cpu_s = 600;
  o.sandbox.limits.memory_mb = 8192;  // LibTorch maps a lot of address space
  o.sandbox.readonly_paths.push_back(fs::path(rlx::test_paths::kCli).parent_path().string());
  o.sandbox.readonly_paths.push_back(kTokenizer.parent_path().string());
  o.writable = {dir.path.string()};
  return o;
}

// Whether a process whose command line mentions `needle` exists (zombies aside).
bool process_with(const std::string& needle) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::string cmdline = rlx::test::read_file(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    const std::string stat = rlx::test::read_file(e.path() / "stat");
    if (cmdline.find(needle) != std::string::npos && stat.find(") Z ") == std::string::npos) return true;
  }
  return false;
}

// Stops a thread that runs until `stop` at the end of the scope (a failed check included).
struct StopAndJoin {
  std::atomic<bool>& stop;
  std::thread& thread;
  ~StopAndJoin() {
    stop = true;
    thread.join();
  }
};

std::vector<rlx::TokenId> ids(const std::string& text) {
  static const auto tok = rlx::load_tokenizer(kTokenizer);
  return tok->encode(text);
}

}  // namespace

TEST_CASE("env server: a sandboxed server process, killed mid-episode, recovers the episode", "[env][server]") {
  REQUIRE(fs::exists(kTokenizer));
  rlx::test::TempDir dir;
  rlx::env::EnvServerProcess server(server_options(dir));
  // Each start loads LibTorch (seconds on a loaded machine): generous per-call timeouts. A
  // dead server is noticed at once (the supervisor polls it), not at the timeout.
  rlx::env::RemoteEnv remote({.address = "ipc://" + (dir / "env.sock").string(), .env = "guess_number", .timeout_s = 30,
                              .retries = 4, .server = &server});
  // The same episode locally, for comparison.
  const auto tok = rlx::load_tokenizer(kTokenizer);
  rlx::env::Registry reg;
  rlx::env::register_bundled(reg);
  auto local = reg.make("guess_number", {.tokenizer = tok.get()});

  const json task = {{"target", 42}, {"range", 100}};
  CHECK(remote.reset(task) == local->reset(task));
  auto a = remote.step(ids("50")), b = local->step(ids("50"));
  CHECK(a.observation == b.observation);  // "Lower."
  CHECK_FALSE(a.done);

  // SIGKILL the whole server (the sandbox wrapper; its pid namespace goes with it).
  REQUIRE(::kill(server.pid(), SIGKILL) == 0);
  // The server goes with it (parent-death signals down to the sandbox's init); wait until
  // it is gone, bounded, so the next step meets a dead server.
  const std::string serve_marker = "env serve --address ipc://" + (dir / "env.sock").string();
  for (int i = 0; i < 500 && process_with(serve_marker); ++i) ::usleep(10000);
  REQUIRE_FALSE(process_with(serve_marker));
  a = remote.step(ids("25"));
  b = local->step(ids("25"));
  CHECK(a.observation == b.observation);  // "Higher.": the episode continued where it was
  CHECK(server.restarts() == 1);
  CHECK(remote.recoveries() >= 1);
  a = remote.step(ids("42"));
  CHECK(a.done);
  CHECK(a.reward == 1.0);
  CHECK(json::parse(remote.save_state())["guesses"] == json::array({50, 25, 42}));  // each step applied once

  // A data error (bad task) is reported as such, and the server keeps serving.
  CHECK_THROWS_WITH(remote.reset(json{{"target", 500}, {"range", 10}}), Catch::Contains("outside [1, 10]"));
  CHECK(remote.reset(task).size() > 0);
}

TEST_CASE("env server: an episode whose server another client restarted is put back, not failed as bad data",
          "[env][server]") {
  REQUIRE(fs::exists(kTokenizer));
  rlx::test::TempDir dir;
  rlx::env::EnvServerProcess server(server_options(dir));
  const std::string address = "ipc://" + (dir / "env.sock").string();
  // Two episodes on one supervised server, as a rollout worker runs them.
  rlx::env::RemoteEnv a({.address = address, .env = "guess_number", .timeout_s = 30, .retries = 4, .server = &server});
  rlx::env::RemoteEnv b({.address = address, .env = "guess_number", .timeout_s = 30, .retries = 4, .server = &server});
  const json task = {{"target", 42}, {"range", 100}};
  REQUIRE(a.reset(task).size() > 0);
  REQUIRE(b.reset(task).size() > 0);
  REQUIRE(b.step(ids("50")).observation.size() > 0);
  REQUIRE(::kill(server.pid(), SIGKILL) == 0);
  const std::string serve_marker = "env serve --address " + address;
  for (int i = 0; i < 500 && process_with(serve_marker); ++i) ::usleep(10000);
  REQUIRE_FALSE(process_with(serve_marker));
  // a notices the death and restarts the server; b's next step then reaches a live server
  // that never saw b's episode. It must come back from b's last state, not end as a data error.
  CHECK(a.step(ids("10")).observation.size() > 0);
  CHECK(server.restarts() == 1);
  const auto before = b.recoveries();
  const auto r = b.step(ids("42"));
  CHECK(r.done);
  CHECK(r.reward == 1.0);
  CHECK(b.recoveries() > before);
  CHECK(json::parse(b.save_state())["guesses"] == json::array({50, 42}));
}

TEST_CASE("env server: a dead server without a supervisor is an infra error", "[env][server]") {
  rlx::test::TempDir dir;
  auto server = std::make_unique<rlx::env::EnvServerProcess>(server_options(dir));
  const std::string address = "ipc://" + (dir / "env.sock").string();
  const json task = {{"prompt", "Compute 1 + 1."}, {"answer", 2}};
  // The server loads LibTorch first (seconds on a loaded machine): wait for it patiently once.
  REQUIRE(rlx::env::RemoteEnv({.address = address, .env = "arithmetic", .timeout_s = 60, .retries = 0}).reset(task).size() > 0);
  rlx::env::RemoteEnv remote({.address = address, .env = "arithmetic", .timeout_s = 1, .retries = 1});
  REQUIRE(remote.reset(task).size() > 0);
  server.reset();  // stopped for good
  CHECK_THROWS_AS(remote.step(ids("2")), rlx::env::InfraError);
}

// A grant's episodes are called together (reset_all, step_all: every request sent, then the
// answers gathered). Each outcome is that episode's own: a bad task fails only its episode,
// a server killed between two rounds is restarted once and every episode continues from its
// last state with each step applied once, and an in-process Env in the same batch is called
// as it is.
TEST_CASE("env server: many episodes' calls at once equal the calls one by one, each failing on its own", "[env][server]") {
  REQUIRE(fs::exists(kTokenizer));
  rlx::test::TempDir dir;
  rlx::env::EnvServerProcess server(server_options(dir));
  const std::string address = "ipc://" + (dir / "env.sock").string();
  const auto tok = rlx::load_tokenizer(kTokenizer);
  rlx::env::Registry reg;
  rlx::env::register_bundled(reg);
  constexpr size_t kN = 12, kBad = 3, kLocal = 7;
  std::vector<std::unique_ptr<rlx::env::Env>> envs, locals;
  std::vector<rlx::env::Env*> all;
  std::vector<json> tasks;
  std::vector<const json*> task_of;
  for (size_t i = 0; i < kN; ++i) {
    if (i == kLocal)
      envs.push_back(reg.make("guess_number", {.tokenizer = tok.get()}));
    else
      envs.push_back(std::make_unique<rlx::env::RemoteEnv>(rlx::env::RemoteEnvOptions{
          .address = address, .env = "guess_number", .timeout_s = 30, .retries = 4, .server = &server}));
    locals.push_back(reg.make("guess_number", {.tokenizer = tok.get()}));
    all.push_back(envs.back().get());
    tasks.push_back(i == kBad ? json{{"target", 500}, {"range", 10}} : json{{"target", 10 + i}, {"range", 100}});
  }
  for (const auto& t : tasks) task_of.push_back(&t);

  auto prompts = rlx::env::reset_all(all, task_of);
  REQUIRE(prompts.size() == kN);
  for (size_t i = 0; i < kN; ++i) {
    INFO("episode " << i);
    if (i == kBad) {
      REQUIRE(prompts[i].error);
      CHECK_THROWS_WITH(std::rethrow_exception(prompts[i].error), Catch::Contains("outside [1, 10]"));
      continue;
    }
    REQUIRE_FALSE(prompts[i].error);
    CHECK(prompts[i].value == locals[i]->reset(tasks[i]));
  }
  all.erase(all.begin() + kBad);
  locals.erase(locals.begin() + kBad);
  tasks.erase(tasks.begin() + kBad);

  // Two rounds of guesses; the server is killed between them.
  const std::string serve_marker = "env serve --address " + address;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      REQUIRE(::kill(server.pid(), SIGKILL) == 0);
      for (int i = 0; i < 500 && process_with(serve_marker); ++i) ::usleep(10000);
      REQUIRE_FALSE(process_with(serve_marker));
    }
    std::vector<std::vector<rlx::TokenId>> guesses;
    for (size_t i = 0; i < all.size(); ++i) guesses.push_back(ids(round == 0 ? "50" : std::to_string(tasks[i]["target"].get<int>())));
    const auto t0 = std::chrono::steady_clock::now();
    auto steps = rlx::env::step_all(all, guesses);
    // Requests that went to the killed server are lost with it: after the first episode finds
    // it dead, the others call again at once instead of each waiting out its 30 s timeout.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(25));
    for (size_t i = 0; i < all.size(); ++i) {
      INFO("round " << round << ", episode " << i);
      REQUIRE_FALSE(steps[i].error);
      const auto want = locals[i]->step(guesses[i]);
      CHECK(steps[i].value.observation == want.observation);
      CHECK(steps[i].value.done == want.done);
      CHECK(steps[i].value.reward == want.reward);
      CHECK(all[i]->save_state() == locals[i]->save_state());  // each guess applied once
    }
  }
  CHECK(server.restarts() == 1);

  // Closed together; the connections serve the next episodes.
  rlx::env::close_all(all);
  envs.clear();
  rlx::env::RemoteEnv next({.address = address, .env = "guess_number", .timeout_s = 30, .retries = 4, .server = &server});
  CHECK(next.reset(json{{"target", 5}, {"range", 10}}).size() > 0);
  CHECK(next.step(ids("5")).done);
}

// The ops travel as an enum (bus protocol 8): a peer of another protocol version is refused
// at once with an error that names both versions, on either side of the connection.
TEST_CASE("env server: a peer of another protocol version is refused, naming both versions", "[env][server]") {
  REQUIRE(fs::exists(kTokenizer));
  rlx::test::TempDir dir;
  const std::string address = "ipc://" + (dir / "env.sock").string();
  const auto tok = rlx::load_tokenizer(kTokenizer);
  rlx::env::Registry reg;
  rlx::env::register_bundled(reg);
  std::atomic<bool> stop{false};
  std::thread server([&] { rlx::env::serve_envs({.address = address}, reg, {.tokenizer = tok.get()}, stop); });
  const StopAndJoin guard{stop, server};
  // This version's client: reset, step and close by enum.
  {
    rlx::env::RemoteEnv remote({.address = address, .env = "guess_number", .timeout_s = 30, .retries = 0});
    const json task = {{"target", 42}, {"range", 100}};
    CHECK(remote.reset(task).size() > 0);
    CHECK(remote.step(ids("42")).done);
  }
  // An old client (protocol 7): the server answers with a refusal naming both versions.
  zmq::context_t ctx;
  zmq::socket_t old_client(ctx, zmq::socket_type::dealer);
  old_client.set(zmq::sockopt::rcvtimeo, 30000);
  old_client.set(zmq::sockopt::linger, 0);
  old_client.connect(address);
  std::string old_request = rlx::bus::pack(rlx::bus::EnvRequest{.episode = 1, .env = "guess_number", .payload = "{}"}, 1);
  old_request[4] = 7;
  old_client.send(zmq::buffer(old_request), zmq::send_flags::none);
  zmq::message_t answer;
  REQUIRE(old_client.recv(answer));
  const std::string bytes = answer.to_string();
  const auto reply = rlx::bus::unpack<rlx::bus::EnvReply>(rlx::bus::decode_frame(bytes, {}), {});
  CHECK_THAT(reply.error, Catch::Matchers::Contains("refused: protocol version 7 (this build speaks 8)"));
}

TEST_CASE("env server: a server of another protocol version is refused by the client at once", "[env][server]") {
  rlx::test::TempDir dir;
  const std::string address = "ipc://" + (dir / "old.sock").string();
  // A server of protocol 7: it answers every request, in its own version.
  zmq::context_t ctx;
  zmq::socket_t old_server(ctx, zmq::socket_type::router);
  old_server.set(zmq::sockopt::linger, 0);
  old_server.bind(address);
  std::atomic<bool> stop{false};
  std::atomic<int> requests{0};
  std::thread serving([&] {
    old_server.set(zmq::sockopt::rcvtimeo, 100);
    while (!stop) {
      zmq::message_t route, body;
      if (!old_server.recv(route)) continue;
      (void)old_server.recv(body);
      const auto req = rlx::bus::unpack<rlx::bus::EnvRequest>(rlx::bus::decode_frame(body.to_string(), {}), {});
      ++requests;
      std::string reply = rlx::bus::pack(rlx::bus::EnvReply{.episode = req.episode, .turn = req.turn}, 1);
      reply[4] = 7;
      old_server.send(route, zmq::send_flags::sndmore);
      old_server.send(zmq::buffer(reply), zmq::send_flags::none);
    }
  });
  const StopAndJoin guard{stop, serving};
  rlx::env::RemoteEnv remote({.address = address, .env = "guess_number", .timeout_s = 30, .retries = 3});
  const std::string e = rlx::test::error_of([&] { remote.reset({{"target", 1}}); });
  CHECK_THAT(e, Catch::Matchers::Contains("refused, the server's answer has protocol version 7 (this build speaks 8)"));
  CHECK(requests == 1);  // not retried: another version never answers this one
}
