// rlx bench bus      trajectory groups through the hub vs raw ZeroMQ PUSH/PULL, same bytes, same run
//
// Two shapes. By default every peer is a thread of this process (one ZeroMQ context, one
// I/O thread). With --processes every peer is a process of its own, as in a real run: the
// hub here, the worker and the learner in `rlx bench bus-peer` children, and raw PUSH in a
// child against PULL here. Children are stepped through their stdin and stdout.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "bench_usage.hpp"
#include "bus_commands.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/log.hpp"

extern char** environ;

namespace rlx::cli {

namespace {

struct BenchArgs {
  int groups = 96, samples = 8, tokens = 2048;
  std::string transports = "ipc,tcp";
  // Groups a worker may have in flight: 32, the messages raw PUSH/PULL may have queued
  // (its two high-water marks of 16).
  int credits = 32;
  int batch_groups = 16;
  int reps = 3;
  double coalesce_us = bus::HubOptions{}.coalesce_us;
  bool store = false;  // the hub appends every accepted group to an HDF5 file (hub.trajectory_file)
  bool processes = false;
};

// A peer process's waits: generous, but bounded.
constexpr double kPeerTimeoutS = 120;

// --- peers as processes ------------------------------------------------------------------

// A bench peer in a process of its own: this executable's `bench bus-peer ROLE ...`,
// stepped through its stdin and stdout, one line each way per step.
class PeerProcess {
 public:
  PeerProcess(std::string what, const std::vector<std::string>& args) : what_(std::move(what)) {
    int in[2], out[2];
    RLX_CHECK(::pipe2(in, O_CLOEXEC) == 0, "bench: pipe: {}", std::strerror(errno));
    RLX_CHECK(::pipe2(out, O_CLOEXEC) == 0, "bench: pipe: {}", std::strerror(errno));
    std::vector<std::string> all{"rlx", "bench", "bus-peer"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 leaves the copies open across exec
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    // By its path, not /proc/self/exe: the child's threads are then named after it, not "exe".
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    const int rc = ::posix_spawn(&pid_, ec ? "/proc/self/exe" : self.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1], from_ = out[0];
    if (rc != 0) {
      close_pipes();
      throw Error(fmt::format("bench: cannot start the {} process: {}", what_, std::strerror(rc)));
    }
  }
  ~PeerProcess() {
    close_pipes();
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  void say(const std::string& line) {
    const std::string l = line + "\n";
    RLX_CHECK(::write(to_, l.data(), l.size()) == static_cast<ssize_t>(l.size()), "bench: cannot write to the {} process: {}",
              what_, std::strerror(errno));
  }

  // Its next line, within kPeerTimeoutS.
  std::string hear() {
    const double end = now_s() + kPeerTimeoutS;
    for (;;) {
      if (const auto nl = buffered_.find('\n'); nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      RLX_CHECK(buffered_.size() < (1u << 20), "bench: the {} process wrote a line of over 1 MiB", what_);
      pollfd p{from_, POLLIN, 0};
      const double left = end - now_s();
      if (left <= 0) throw Error(fmt::format("bench: the {} process said nothing for {:.0f} s", what_, kPeerTimeoutS));
      if (::poll(&p, 1, static_cast<int>(left * 1e3) + 1) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(from_, chunk, sizeof chunk);
      if (n > 0) {
        buffered_.append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      throw Error(fmt::format("bench: the {} process ended early ({}); its stderr says why", what_, status_text(wait())));
    }
  }
  // Its next line, which must be `word`.
  void expect(const std::string& word) {
    const auto line = hear();
    RLX_CHECK(line == word, "bench: the {} process said '{}', expected '{}'", what_, line, word);
  }
  // Its last line: what it used (JSON), after which it must exit 0.
  nlohmann::json report() {
    const auto line = hear();
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    RLX_CHECK(!j.is_discarded(), "bench: the {} process reported '{}', not JSON", what_, line.substr(0, 200));
    const int status = wait();
    RLX_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench: the {} process failed ({})", what_, status_text(status));
    return j;
  }

 private:
  int wait() {
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, 0) == pid_) pid_ = -1;
    return status;
  }
  static std::string status_text(int status) {
    if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
    return "status unknown";
  }
  void close_pipes() {
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
    to_ = from_ = -1;
  }
  std::string what_;
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffered_;
};

// The child's side of the steps.
void say(const std::string& line) { std::cout << line << std::endl; }
void expect(const std::string& word) {
  std::string line;
  RLX_CHECK(std::getline(std::cin, line) && line == word, "bench peer: expected '{}' on stdin, got '{}'", word, line);
}

// --- raw ZeroMQ --------------------------------------------------------------------------

// Messages of `bytes` each for raw PUSH: `distinct` buffers built before timing like the
// bus's groups (memory the producer reads cold), or one sent every time (it stays in the cache).
std::vector<std::string> raw_payloads(int n, size_t bytes, bool distinct) {
  std::vector<std::string> payloads(distinct ? static_cast<size_t>(n) : 1);
  for (size_t i = 0; i < payloads.size(); ++i) payloads[i].assign(bytes, static_cast<char>('a' + i % 26));
  return payloads;
}

void raw_configure(zmq::socket_t& s) {
  s.set(zmq::sockopt::sndhwm, 16);
  s.set(zmq::sockopt::rcvhwm, 16);
  s.set(zmq::sockopt::rcvtimeo, static_cast<int>(kPeerTimeoutS * 1e3));
  s.set(zmq::sockopt::sndtimeo, static_cast<int>(kPeerTimeoutS * 1e3));
}

void raw_send(zmq::socket_t& push, const std::string& payload) {
  RLX_CHECK(push.send(zmq::buffer(payload), zmq::send_flags::none), "raw bench: PUSH could not send for {:.0f} s", kPeerTimeoutS);
}

size_t raw_receive(zmq::socket_t& pull, zmq::message_t& msg) {
  RLX_CHECK(pull.recv(msg), "raw bench: PULL received nothing for {:.0f} s", kPeerTimeoutS);
  return msg.size();
}

// Raw ZeroMQ: PUSH -> PULL of `n` messages of `bytes` each, PUSH in a thread or a process.
Timed raw_push_pull(const std::string& address, int n, size_t bytes, bool distinct, bool processes) {
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  raw_configure(pull);
  pull.bind(address);
  const std::string endpoint = pull.get(zmq::sockopt::last_endpoint);
  zmq::message_t msg;
  Timed t;
  size_t got = 0;
  if (processes) {
    PeerProcess push("raw PUSH", {"push", "--address", endpoint, "--groups", std::to_string(n), "--bytes",
                                  std::to_string(bytes), distinct ? "--distinct" : "--same"});
    push.expect("ready");
    (void)raw_receive(pull, msg);  // its warm-up message
    const Usage use;
    push.say("go");
    for (int i = 0; i < n; ++i) got += raw_receive(pull, msg);
    t.wall_s = use.wall_s();
    t.add(use.take(n, "pull/"));
    push.say("done");
    t.add(push.report());
  } else {
    zmq::socket_t push(ctx, zmq::socket_type::push);
    raw_configure(push);
    push.connect(endpoint);
    const auto payloads = raw_payloads(n, bytes, distinct);
    raw_send(push, payloads[0]);  // warm the connection
    (void)raw_receive(pull, msg);
    const Usage use;
    std::exception_ptr failed;
    std::thread producer([&] {
      ::pthread_setname_np(::pthread_self(), "rlx-raw-push");
      try {
        for (size_t i = 0; i < static_cast<size_t>(n); ++i) raw_send(push, payloads[i % payloads.size()]);
      } catch (...) {
        failed = std::current_exception();
      }
    });
    try {
      for (int i = 0; i < n; ++i) got += raw_receive(pull, msg);
    } catch (...) {
      producer.join();  // its sends time out too
      throw;
    }
    t.wall_s = use.wall_s();
    t.add(use.take(n));  // before the producer ends, to count it
    producer.join();
    if (failed) std::rethrow_exception(failed);
  }
  RLX_CHECK(got == bytes * static_cast<size_t>(n), "raw bench lost bytes");
  return t;
}

// --- the bus ----------------------------------------------------------------------------

// The hub of one measurement, serving from a thread of this process until destroyed.
class BenchHub {
 public:
  BenchHub(const std::string& address, const BenchArgs& a)
      : store_(a.store ? fmt::format("/tmp/rlx-bench-bus-{}.h5", ::getpid()) : ""),
        hub_(options(address, a, store_), prompts(a.groups)) {
    thread_ = std::thread([this] {
      ::pthread_setname_np(::pthread_self(), "rlx-hub");
      hub_.run(stop_);
    });
  }
  ~BenchHub() {
    stop_ = true;
    thread_.join();
    std::error_code ec;
    if (!store_.empty()) std::filesystem::remove(store_, ec);
  }
  std::string endpoint() const { return hub_.endpoint(); }

 private:
  static bus::HubOptions options(const std::string& address, const BenchArgs& a, const std::string& store) {
    bus::HubOptions ho;
    ho.address = address;
    ho.group_size = static_cast<uint32_t>(a.samples);
    ho.max_leases_per_request = static_cast<uint32_t>(a.groups);
    ho.replay.capacity_groups = static_cast<size_t>(a.groups) + 8;
    ho.credits_per_peer = static_cast<uint32_t>(a.credits);
    ho.replay.max_staleness = 1000;
    ho.coalesce_us = a.coalesce_us;
    ho.trajectory_file = store;
    if (!store.empty()) std::filesystem::remove(store);  // a fresh file per measurement
    return ho;
  }
  static std::vector<std::string> prompts(int n) {
    std::vector<std::string> records;
    for (int i = 0; i < n; ++i) records.push_back(fmt::format("{{\"prompt\":\"p{}\"}}", i));
    return records;
  }
  std::string store_;
  std::atomic<bool> stop_{false};
  bus::Hub hub_;
  std::thread thread_;
};

// A bench worker: takes `groups` leases and builds their groups (untimed), then submits
// them all and waits for every ack (timed by `ingest`, which gets the frame size).
class BenchWorker {
 public:
  BenchWorker(const std::string& endpoint, int groups, int samples, int tokens)
      : client_({.address = endpoint, .who = "bench-worker", .request_timeout_s = kPeerTimeoutS, .credit_wait_s = kPeerTimeoutS}) {
    auto grant = client_.request_leases(static_cast<uint32_t>(groups));
    RLX_CHECK(grant.leases.size() == static_cast<size_t>(groups), "bench: got {} leases, asked for {}", grant.leases.size(), groups);
    RLX_CHECK(grant.leases.front().group_size == static_cast<uint32_t>(samples), "bench: the hub's groups have {} samples, not {}",
              grant.leases.front().group_size, samples);
    for (const auto& l : grant.leases) groups_.push_back(synthetic_group(l, tokens, 64));
    frame_bytes_ = bus::pack(groups_.front()).size();
  }
  size_t frame_bytes() const { return frame_bytes_; }
  void ingest() {
    const auto n = groups_.size();
    for (auto& g : groups_) client_.submit(std::move(g));
    RLX_CHECK(client_.flush(kPeerTimeoutS), "bench: groups not acknowledged");
    RLX_CHECK(client_.counters().verdicts["accepted"] == n, "bench: not every group accepted");
  }

 private:
  bus::Client client_;
  std::vector<bus::TrajectoryGroup> groups_;
  size_t frame_bytes_ = 0;
};

// A bench learner: reads batches of `batch_groups` in place, as the launcher's learner does
// (every frame checked), until it has `groups` (timed by `drain`); `prefetch` batches asked
// ahead. Connecting and closing stay outside the timing (closing waits up to one 50 ms poll
// slice for the client's thread).
class BenchLearner {
 public:
  BenchLearner(const std::string& endpoint, int prefetch)
      : client_({.address = endpoint, .who = "bench-learner", .role = "learner", .request_timeout_s = kPeerTimeoutS,
                 .prefetch_batches = prefetch}) {}
  void drain(int groups, int batch_groups) {
    size_t got = 0;
    while (got < static_cast<size_t>(groups))
      got += client_.next_batch_view({.max_groups = static_cast<uint32_t>(batch_groups)}, kPeerTimeoutS).groups.size();
  }

 private:
  bus::Client client_;
};

struct BusResult {
  Timed ingest, drain;
  size_t frame_bytes = 0;
};

// Groups through the hub: a worker submits `groups` (ingest, until every ack), then a
// learner drains them (drain), asking for `prefetch` batches ahead.
BusResult bus_roundtrip(const std::string& address, const BenchArgs& a, int prefetch) {
  BenchHub hub(address, a);
  BusResult r;
  const auto peer = [&](const std::string& role, std::vector<std::string> args) {
    std::vector<std::string> all{role, "--address", hub.endpoint(), "--groups", std::to_string(a.groups)};
    all.insert(all.end(), args.begin(), args.end());
    return std::make_unique<PeerProcess>("bus " + role, all);
  };
  if (a.processes) {
    // One timed step of a peer: "go" once it is ready, then its report. `into` gets its wall
    // time and what it and the hub used meanwhile.
    const auto step = [&](PeerProcess& p, Timed& into) {
      p.expect("ready");
      const Usage use;
      p.say("go");
      auto used = p.report();
      into.wall_s = used.at("wall_s").get<double>();
      into.add(use.take(a.groups, "hub/"));
      into.add(used);
      return used;
    };
    auto worker = peer("worker", {"--samples", std::to_string(a.samples), "--tokens", std::to_string(a.tokens)});
    r.frame_bytes = step(*worker, r.ingest).at("frame_bytes").get<size_t>();
    auto learner = peer("learner", {"--batch-groups", std::to_string(a.batch_groups), "--prefetch", std::to_string(prefetch)});
    step(*learner, r.drain);
    return r;
  }
  BenchWorker worker(hub.endpoint(), a.groups, a.samples, a.tokens);
  r.frame_bytes = worker.frame_bytes();
  const Usage use;
  worker.ingest();
  r.ingest.wall_s = use.wall_s();
  r.ingest.add(use.take(a.groups));
  BenchLearner learner(hub.endpoint(), prefetch);
  const Usage use2;
  learner.drain(a.groups, a.batch_groups);
  r.drain.wall_s = use2.wall_s();
  r.drain.add(use2.take(a.groups));
  return r;
}

// `rlx bench bus-peer ROLE`: one peer of --processes. Says "ready" when set up, waits for
// "go", does its timed part, and (raw PUSH: after "done", once PULL has everything) reports
// what it used as one JSON line.
void add_bench_peer(CLI::App* bench, Action& action) {
  struct PeerArgs {
    std::string role, address;
    int groups = 0, samples = 8, tokens = 2048, batch_groups = 16, prefetch = 0;
    size_t bytes = 0;
    bool distinct = true;
  };
  auto p = std::make_shared<PeerArgs>();
  auto* c = bench->add_subcommand("bus-peer", "(internal) one peer process of `rlx bench bus --processes`");
  c->group("");  // not listed in --help
  c->add_option("role", p->role, "push, worker or learner")->required()->check(CLI::IsMember({"push", "worker", "learner"}));
  c->add_option("--address", p->address, "the endpoint to connect to")->required();
  c->add_option("--groups", p->groups, "messages or groups")->required()->check(CLI::PositiveNumber);
  c->add_option("--samples", p->samples, "worker: samples per group");
  c->add_option("--tokens", p->tokens, "worker: tokens per sample");
  c->add_option("--bytes", p->bytes, "push: bytes per message");
  c->add_option("--batch-groups", p->batch_groups, "learner: groups per batch");
  c->add_option("--prefetch", p->prefetch, "learner: batches asked ahead");
  c->add_flag("--distinct,!--same", p->distinct, "push: a buffer per message (default), or one for all");
  c->callback([p, &action] {
    action = [p] {
      bus::keep_frame_memory();
      log::set_level(log::Level::warn);
      nlohmann::json used;
      if (p->role == "push") {
        zmq::context_t ctx(1);
        zmq::socket_t push(ctx, zmq::socket_type::push);
        raw_configure(push);
        push.connect(p->address);
        const auto payloads = raw_payloads(p->groups, p->bytes, p->distinct);
        raw_send(push, payloads[0]);  // warms the connection
        say("ready");
        expect("go");
        const Usage use;
        for (size_t i = 0; i < static_cast<size_t>(p->groups); ++i) raw_send(push, payloads[i % payloads.size()]);
        expect("done");  // its I/O thread may still be writing until then
        used = use.take(p->groups, "push/");
      } else if (p->role == "worker") {
        BenchWorker worker(p->address, p->groups, p->samples, p->tokens);
        say("ready");
        expect("go");
        const Usage use;
        worker.ingest();
        used = use.take(p->groups, "worker/");
        used["frame_bytes"] = worker.frame_bytes();
      } else {
        BenchLearner learner(p->address, p->prefetch);
        say("ready");
        expect("go");
        const Usage use;
        learner.drain(p->groups, p->batch_groups);
        used = use.take(p->groups, "learner/");
      }
      say(used.dump());
      return 0;
    };
  });
}

}  // namespace

void add_bench_bus(CLI::App& app, Action& action) {
  auto* bench = app.get_subcommand("bench");
  add_bench_peer(bench, action);
  auto a = std::make_shared<BenchArgs>();
  auto* c = bench->add_subcommand("bus", "Trajectory groups through the hub vs raw ZeroMQ PUSH/PULL (same bytes, same run)");
  c->add_option("--groups", a->groups, "trajectory groups per measurement")->capture_default_str();
  c->add_option("--samples", a->samples, "samples per group")->capture_default_str();
  c->add_option("--tokens", a->tokens, "tokens per sample")->capture_default_str();
  c->add_option("--transports", a->transports, "comma-separated: ipc, tcp")->capture_default_str();
  c->add_option("--credits", a->credits, "credits per worker")->capture_default_str();
  c->add_option("--batch-groups", a->batch_groups, "groups per learner batch while draining")->capture_default_str();
  c->add_option("--reps", a->reps, "measurements per path (after one warm-up each); medians reported")->capture_default_str();
  c->add_option("--coalesce-us", a->coalesce_us, "the hub's hub.coalesce_us")->capture_default_str()->check(CLI::Range(0.0, 10000.0));
  c->add_flag("--store", a->store, "the hub also appends every accepted group to an HDF5 file (hub.trajectory_file, in /tmp)");
  c->add_flag("--processes", a->processes,
              "every peer a process of its own (hub, worker, learner; raw PUSH and PULL), as in a real run; "
              "default: threads of one process");
  c->callback([a, &action] {
    action = [a] {
      bus::keep_frame_memory();
      log::set_level(log::Level::warn);
      nlohmann::json result = {{"bench", "bus"}, {"groups", a->groups}, {"samples", a->samples}, {"tokens", a->tokens},
                               {"shape", a->processes ? "processes" : "threads"}};
      a->batch_groups = std::min(a->batch_groups, a->groups);
      result["drain_batch_groups"] = a->batch_groups;
      result["coalesce_us"] = a->coalesce_us;
      result["store"] = a->store;
      RLX_CHECK(a->batch_groups > 0 && a->groups % a->batch_groups == 0, "--batch-groups {} must divide --groups {}",
                a->batch_groups, a->groups);
      std::stringstream ss(a->transports);
      for (std::string t; std::getline(ss, t, ',');) {
        RLX_CHECK(t == "ipc" || t == "tcp", "--transports: '{}' is not ipc or tcp", t);
        const std::string addr = t == "ipc" ? fmt::format("ipc:///tmp/rlx-bench-bus-{}.sock", ::getpid()) : "tcp://127.0.0.1:0";
        const std::string raw_addr = t == "ipc" ? fmt::format("ipc:///tmp/rlx-bench-raw-{}.sock", ::getpid()) : "tcp://127.0.0.1:0";
        // Every measurement binds the path again, and libzmq can leave it behind when one
        // socket's close trails the next one's bind: both go when the transport is done.
        struct RemoveSockets {
          std::vector<std::string> endpoints;
          ~RemoveSockets() {
            std::error_code ec;
            for (const auto& e : endpoints)
              if (e.starts_with("ipc://")) std::filesystem::remove(e.substr(6), ec);
          }
        } remove_sockets{{addr, raw_addr}};
        // One untimed pass each warms the allocator and the sockets; then raw and bus
        // alternate so both see the same machine state.
        const size_t frame_bytes = bus_roundtrip(addr, *a, 0).frame_bytes;
        (void)raw_push_pull(raw_addr, a->groups, frame_bytes, true, a->processes);
        std::vector<double> raw_v, raw_hot_v, ingest_v, drain_v, raw_cpu_v, ingest_cpu_v, drain_cpu_v, ahead_v, ahead_cpu_v;
        Timed raw, ingest, drained;  // the last measurement's
        for (int r = 0; r < std::max(1, a->reps); ++r) {
          raw = raw_push_pull(raw_addr, a->groups, frame_bytes, true, a->processes);
          raw_v.push_back(raw.wall_s);
          raw_cpu_v.push_back(raw.cpu_s);
          raw_hot_v.push_back(raw_push_pull(raw_addr, a->groups, frame_bytes, false, a->processes).wall_s);
          const auto b = bus_roundtrip(addr, *a, 0), ahead = bus_roundtrip(addr, *a, 1);
          ingest = b.ingest, drained = b.drain;
          ahead_v.push_back(ahead.drain.wall_s);
          ahead_cpu_v.push_back(ahead.drain.cpu_s);
          ingest_v.push_back(b.ingest.wall_s);
          drain_v.push_back(b.drain.wall_s);
          ingest_cpu_v.push_back(b.ingest.cpu_s);
          drain_cpu_v.push_back(b.drain.cpu_s);
        }
        const double raw_s = median(raw_v), raw_hot_s = median(raw_hot_v), ingest_s = median(ingest_v), drain_s = median(drain_v);
        // Each repetition's own ratio, raw and bus seconds apart: the machine's slow drifts
        // (this VM's neighbours) cancel in the pair; the median of the pairs.
        const auto paired = [&](const std::vector<double>& bus_v) {
          std::vector<double> r;
          for (size_t i = 0; i < bus_v.size(); ++i) r.push_back(raw_v[i] / bus_v[i]);
          return median(r);
        };
        const double us_per = 1e6 / a->groups;  // CPU microseconds (all threads) per message
        const double bytes = static_cast<double>(frame_bytes) * a->groups;
        nlohmann::json j = {{"frame_bytes", frame_bytes},
                            {"raw_msgs_per_s", a->groups / raw_s},
                            {"raw_gb_per_s", bytes / raw_s / 1e9},
                            {"raw_hot_gb_per_s", bytes / raw_hot_s / 1e9},
                            {"ingest_msgs_per_s", a->groups / ingest_s},
                            {"ingest_gb_per_s", bytes / ingest_s / 1e9},
                            {"drain_msgs_per_s", a->groups / drain_s},
                            {"drain_gb_per_s", bytes / drain_s / 1e9},
                            {"ingest_vs_raw", raw_s / ingest_s},
                            {"ingest_vs_raw_paired", paired(ingest_v)},
                            {"drain_prefetch_vs_raw_paired", paired(ahead_v)},
                            {"drain_vs_raw", raw_s / drain_s},
                            {"drain_prefetch_gb_per_s", bytes / median(ahead_v) / 1e9},
                            {"drain_prefetch_vs_raw", raw_s / median(ahead_v)},
                            {"drain_prefetch_cpu_us_per_group", median(ahead_cpu_v) * us_per},
                            {"ingest_vs_raw_hot", raw_hot_s / ingest_s},
                            {"drain_vs_raw_hot", raw_hot_s / drain_s},
                            {"raw_cpu_us_per_msg", median(raw_cpu_v) * us_per},
                            {"ingest_cpu_us_per_group", median(ingest_cpu_v) * us_per},
                            {"drain_cpu_us_per_group", median(drain_cpu_v) * us_per},
                            {"ingest_page_faults_per_group", ingest.faults / a->groups},
                            {"drain_page_faults_per_group", drained.faults / a->groups},
                            {"raw_threads", raw.threads},
                            {"ingest_threads", ingest.threads},
                            {"drain_threads", drained.threads},
                            {"peak_rss_mb", [&] {  // per process (in threads, the one): the peak so far
                               auto rss = ingest.peak_rss_mb;
                               rss.update(drained.peak_rss_mb);
                               return rss;
                             }()}};
        std::cerr << t << ": " << j.dump() << "\n";
        result[t] = j;
      }
      std::cout << result.dump() << std::endl;
      return 0;
    };
  });
}

}  // namespace rlx::cli
