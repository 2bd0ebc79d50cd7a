// rlx hub serve CONFIG [key=value ...]     run the replay hub (the `hub:` section); SIGTERM saves and stops
// rlx hub stats|save|stop --address A      ask a running hub
// rlx keys generate --out DIR --name NAME  a CURVE key pair: NAME.key (secret) and NAME.pub
// rlx inspect trajectories FILE.h5         summary of a trajectory store; --dump N prints records
// rlx bus worker / rlx bus learner         synthetic peers: load a hub, or test it with real processes
// rlx bench bus                            trajectory groups through the hub vs raw ZeroMQ PUSH/PULL
#include <fmt/format.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <zmq.hpp>

#include "commands.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/bus/h5store.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/log.hpp"
#include "rlx/launch/config.hpp"

namespace rlx::cli {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop = true; }

void install_stop_handlers() { on_stop_signals(on_stop_signal); }

nlohmann::json to_json(const std::vector<std::pair<std::string, double>>& values) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : values) j[k] = v;
  return j;
}


// Options every synthetic or monitoring peer takes.
struct PeerArgs {
  std::string address = "ipc:///tmp/rlx-hub.sock";
  std::string name;
  std::string key_file, server_key_file;
  double timeout_s = 60;
  void add(CLI::App* c, const std::string& default_name) {
    name = default_name;
    c->add_option("--address", address, "the hub's endpoint")->capture_default_str();
    c->add_option("--name", name, "this peer's name")->capture_default_str();
    c->add_option("--key-file", key_file, "CURVE: this peer's NAME.key");
    c->add_option("--server-key-file", server_key_file, "CURVE: the hub's NAME.pub");
    c->add_option("--timeout", timeout_s, "seconds to wait for the hub")->capture_default_str();
  }
  bus::ClientOptions client(const std::string& role) const {
    bus::ClientOptions o;
    o.address = address, o.who = name, o.role = role;
    o.request_timeout_s = timeout_s, o.credit_wait_s = timeout_s;
    o.hub_timeout_s = std::min(10.0, timeout_s);
    o.curve.key_file = key_file, o.curve.server_key_file = server_key_file;
    return o;
  }
};

// A group for a lease with deterministic synthetic contents.
bus::TrajectoryGroup synthetic_group(const bus::Lease& lease, int tokens, int prompt_len) {
  bus::TrajectoryGroup g{.lease_id = lease.lease_id, .prompt_index = lease.prompt_index, .epoch = lease.epoch};
  for (uint32_t s = 0; s < lease.group_size; ++s) {
    bus::Trajectory t;
    t.prompt_len = std::min(prompt_len, tokens);
    t.tokens.resize(static_cast<size_t>(tokens));
    t.loss_mask.assign(static_cast<size_t>(tokens), 1);
    t.logprobs.assign(static_cast<size_t>(tokens), -1.0f);
    t.versions.assign(static_cast<size_t>(tokens), lease.min_version);
    for (int i = 0; i < tokens; ++i) {
      t.tokens[static_cast<size_t>(i)] = static_cast<int32_t>((lease.prompt_index * 31 + s * 7 + static_cast<uint64_t>(i)) % 50000);
      if (i < t.prompt_len) t.loss_mask[static_cast<size_t>(i)] = 0, t.logprobs[static_cast<size_t>(i)] = 0, t.versions[static_cast<size_t>(i)] = -1;
    }
    t.reward = static_cast<float>((lease.prompt_index + s) % 2);
    t.finish = "stop";
    t.metadata = fmt::format("{{\"prompt_index\":{}}}", lease.prompt_index);
    g.samples.push_back(std::move(t));
  }
  return g;
}

void add_hub_commands(CLI::App& app, Action& action) {
  auto* hub = app.add_subcommand("hub", "Run or query the replay hub");
  hub->require_subcommand(1);

  struct ServeArgs {
    std::string file;
    std::vector<std::string> overrides;
  };
  auto serve_args = std::make_shared<ServeArgs>();
  auto* serve = hub->add_subcommand("serve", "Serve the config's hub: section until SIGTERM/SIGINT or `rlx hub stop`");
  serve->add_option("config", serve_args->file, "YAML config file")->required();
  serve->add_option("overrides", serve_args->overrides, "section.key=value overrides (e.g. hub.epochs=2)");
  serve->callback([serve_args, &action] {
    action = [serve_args] {
      bus::keep_frame_memory();
      auto cfg = config::load_file<RunConfig>(serve_args->file, serve_args->overrides);
      log::set_level(cfg.log.level);
      log::set_identity("hub");
      install_stop_handlers();
      bus::Hub h(cfg.hub);
      std::cout << "endpoint " << h.endpoint() << std::endl;
      h.run(g_stop);
      std::cout << to_json(h.stats()).dump() << std::endl;
      return 0;
    };
  });

  for (const std::string cmd : {"stats", "save", "stop"}) {
    auto args = std::make_shared<PeerArgs>();
    auto* c = hub->add_subcommand(cmd, cmd == "stats"  ? "Print a running hub's counters as JSON"
                                        : cmd == "save" ? "Make a running hub save its state file now"
                                                        : "Make a running hub save its state and exit");
    args->add(c, fmt::format("monitor-{}", ::getpid()));
    args->timeout_s = 10;
    c->callback([args, cmd, &action] {
      action = [args, cmd] {
        bus::Client client(args->client("monitor"));
        if (cmd == "stats") std::cout << to_json(client.hub_stats()).dump() << std::endl;
        else client.control(cmd);
        return 0;
      };
    });
  }
}

void add_keys_commands(CLI::App& app, Action& action) {
  auto* keys = app.add_subcommand("keys", "CURVE keys for securing tcp:// bus connections");
  keys->require_subcommand(1);
  struct Args {
    std::string out = "keys", name;
  };
  auto args = std::make_shared<Args>();
  auto* gen = keys->add_subcommand("generate", "Write DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub");
  gen->add_option("--out", args->out, "directory")->capture_default_str();
  gen->add_option("--name", args->name, "key name (hub, worker0, ...)")->required();
  gen->callback([args, &action] {
    action = [args] {
      bus::write_curve_keys(bus::generate_curve_keys(), args->out, args->name);
      std::cout << (std::filesystem::path(args->out) / (args->name + ".key")).string() << "\n"
                << (std::filesystem::path(args->out) / (args->name + ".pub")).string() << "\n";
      return 0;
    };
  });
}

void add_inspect_trajectories(CLI::App& app, Action& action) {
  auto* inspect = app.get_subcommand("inspect");
  struct Args {
    std::string file;
    uint64_t dump = 0, first = 0;
  };
  auto args = std::make_shared<Args>();
  auto* c = inspect->add_subcommand("trajectories", "Summarize an HDF5 trajectory store (rlx hub's trajectory_file)");
  c->add_option("file", args->file, "the .h5 file")->required();
  c->add_option("--dump", args->dump, "also print this many groups as JSON lines");
  c->add_option("--first", args->first, "the first group to dump");
  c->callback([args, &action] {
    action = [args] {
      const auto s = bus::summarize_trajectories(args->file);
      nlohmann::json j = {{"file", args->file},         {"groups", s.groups},
                          {"samples", s.samples},       {"tokens", s.tokens},
                          {"policy_tokens", s.policy_tokens}, {"reward_mean", s.reward_mean},
                          {"reward_min", s.reward_min}, {"reward_max", s.reward_max},
                          {"version_min", s.version_min}, {"version_max", s.version_max},
                          {"finish", s.finish},         {"workers", s.workers},
                          {"distinct_leases", s.distinct_leases}, {"distinct_prompts", s.distinct_prompts}};
      std::cout << j.dump(2) << "\n";
      for (const auto& g : bus::read_trajectory_groups(args->file, args->first, args->dump)) {
        nlohmann::json gj = {{"lease_id", g.lease_id}, {"prompt_index", g.prompt_index}, {"epoch", g.epoch},
                             {"worker", g.worker}, {"samples", nlohmann::json::array()}};
        for (const auto& t : g.samples)
          gj["samples"].push_back({{"tokens", t.tokens}, {"loss_mask", t.loss_mask}, {"logprobs", t.logprobs},
                                   {"versions", t.versions}, {"prompt_len", t.prompt_len}, {"reward", t.reward},
                                   {"finish", t.finish}, {"metadata", t.metadata}});
        std::cout << gj.dump() << "\n";
      }
      return 0;
    };
  });
}

void add_synthetic_peers(CLI::App& app, Action& action) {
  auto* busc = app.add_subcommand("bus", "Synthetic bus peers (load and test a hub with real processes)");
  busc->require_subcommand(1);

  struct WorkerArgs {
    PeerArgs peer;
    int tokens = 64, prompt_len = 8, leases = 4, delay_ms = 0;
    uint64_t max_groups = 0;
    uint64_t data_error_every = 0;
  };
  auto w = std::make_shared<WorkerArgs>();
  auto* worker = busc->add_subcommand("worker", "Take leases and answer each with a synthetic trajectory group");
  w->peer.add(worker, fmt::format("worker-{}", ::getpid()));
  worker->add_option("--tokens", w->tokens, "tokens per sample")->capture_default_str();
  worker->add_option("--prompt-len", w->prompt_len, "prompt tokens per sample")->capture_default_str();
  worker->add_option("--leases", w->leases, "leases per request")->capture_default_str();
  worker->add_option("--delay-ms", w->delay_ms, "pause per group (simulated generation)")->capture_default_str();
  worker->add_option("--max-groups", w->max_groups, "stop after this many groups (0: until the data ends)");
  worker->add_option("--data-error-every", w->data_error_every, "report every Nth lease as a data error instead");
  worker->callback([w, &action] {
    action = [w] {
      bus::keep_frame_memory();
      bus::Client c(w->peer.client("worker"));
      uint64_t groups = 0, errors = 0;
      const double start = now_s();
      while (!g_stop && (w->max_groups == 0 || groups < w->max_groups)) {
        auto grant = c.request_leases(static_cast<uint32_t>(w->leases));
        if (grant.exhausted) break;
        if (grant.leases.empty()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          if (now_s() - start > 3600) throw Error("worker: no leases for an hour");
          continue;
        }
        for (const auto& lease : grant.leases) {
          if (w->delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(w->delay_ms));
          if (w->data_error_every && lease.prompt_index % w->data_error_every == 0) {
            c.report_error(lease.lease_id, "data", "synthetic data error");
            ++errors;
          } else {
            c.submit(synthetic_group(lease, w->tokens, w->prompt_len));
            ++groups;
          }
        }
      }
      const bool flushed = c.flush(w->peer.timeout_s);
      const auto k = c.counters();
      nlohmann::json j = {{"worker", w->peer.name}, {"groups", groups}, {"errors", errors}, {"flushed", flushed},
                          {"acked", k.groups_acked}, {"verdicts", k.verdicts}, {"credit_waits", k.credit_waits},
                          {"credit_wait_s", k.credit_wait_s}, {"resent", k.resent}, {"rehellos", k.rehellos},
                          {"reconnects", k.reconnects}};
      std::cout << j.dump() << std::endl;
      return flushed ? 0 : kExitFailure;
    };
  });

  struct LearnerArgs {
    PeerArgs peer;
    uint32_t batch_groups = 4, ranks = 1;
    std::string out;
    int delay_ms = 0;
    bool versions = false;
  };
  auto l = std::make_shared<LearnerArgs>();
  auto* learner = busc->add_subcommand("learner", "Consume batches until the data ends; record what was trained");
  l->peer.add(learner, fmt::format("learner-{}", ::getpid()));
  learner->add_option("--batch-groups", l->batch_groups, "groups per batch")->capture_default_str();
  learner->add_option("--ranks", l->ranks, "learner ranks to split each batch over")->capture_default_str();
  learner->add_option("--out", l->out, "append one JSON line per consumed group to this file");
  learner->add_option("--delay-ms", l->delay_ms, "pause per batch (simulated training)")->capture_default_str();
  learner->add_flag("--versions", l->versions, "publish a new weight version after every batch");
  learner->callback([l, &action] {
    action = [l] {
      bus::keep_frame_memory();
      bus::Client c(l->peer.client("learner"));
      std::ofstream out;
      if (!l->out.empty()) {
        out.open(l->out, std::ios::app);
        RLX_CHECK(out.good(), "cannot write {}", l->out);
      }
      uint64_t batches = 0, groups = 0;
      int64_t version = 0;
      while (!g_stop) {
        const auto b = c.next_batch_view({.max_groups = l->batch_groups, .num_ranks = l->ranks}, l->peer.timeout_s);
        for (size_t i = 0; i < b.groups.size(); ++i) {
          const auto& g = b.groups[i];
          if (out.is_open())
            out << nlohmann::json{{"lease_id", g.lease_id}, {"prompt_index", g.prompt_index}, {"epoch", g.epoch},
                                  {"worker", std::string(g.worker)}, {"rank", b.ranks[i]}, {"batch", b.batch_id}}.dump()
                << "\n";
        }
        if (out.is_open()) out.flush();
        groups += b.groups.size();
        batches += !b.groups.empty();
        if (l->delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(l->delay_ms));
        if (l->versions && !b.groups.empty()) c.publish_version(++version);
        if (b.end) break;
      }
      std::cout << nlohmann::json{{"learner", l->peer.name}, {"batches", batches}, {"groups", groups}}.dump() << std::endl;
      return 0;
    };
  });
}

// --- rlx bench bus ---------------------------------------------------------------------------

struct BenchArgs {
  int groups = 100, samples = 8, tokens = 2048;
  std::string transports = "ipc,tcp";
  // Groups a worker may have in flight: 32, the messages raw PUSH/PULL may have queued
  // (its two high-water marks of 16).
  int credits = 32;
  int batch_groups = 16;
  int reps = 3;
};

// CPU seconds this process has used (every thread, user and system).
double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Minor page faults of this process so far (fresh heap memory touched for the first time).
double page_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timed {
  double wall_s, cpu_s;
  nlohmann::json threads;  // per thread: CPU us and context switches per message
};

// Per thread name (threads that share one are summed): nanoseconds on a CPU and context
// switches, from /proc/self/task/*/{schedstat,status}.
struct ThreadUse {
  double cpu_ns = 0, switches = 0;
};
std::map<std::string, ThreadUse> thread_use() {
  std::map<std::string, ThreadUse> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm"), sched(task.path() / "schedstat"), status(task.path() / "status");
    std::string name;
    double ns = 0;
    if (!std::getline(comm, name) || !(sched >> ns)) continue;  // the thread ended meanwhile
    auto& u = out[name];
    u.cpu_ns += ns;
    for (std::string line; std::getline(status, line);)
      if (line.find("ctxt_switches:") != std::string::npos) u.switches += std::stod(line.substr(line.find(':') + 1));
  }
  return out;
}
// What each thread used between two snapshots, per message.
nlohmann::json thread_use_per(const std::map<std::string, ThreadUse>& before, const std::map<std::string, ThreadUse>& after,
                              int messages) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, a] : after) {
    const auto it = before.find(name);
    const ThreadUse b = it == before.end() ? ThreadUse{} : it->second;
    j[name] = {{"cpu_us", (a.cpu_ns - b.cpu_ns) / 1e3 / messages}, {"switches", (a.switches - b.switches) / messages}};
  }
  return j;
}

// Raw ZeroMQ: PUSH -> PULL of `n` messages of `bytes` each. `distinct`: each message
// from its own buffer, built before timing like the bus's groups (memory the producer
// reads cold); otherwise one buffer sent `n` times (it stays in the cache).
Timed raw_push_pull(const std::string& address, int n, size_t bytes, bool distinct) {
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull), push(ctx, zmq::socket_type::push);
  pull.set(zmq::sockopt::rcvhwm, 16);
  push.set(zmq::sockopt::sndhwm, 16);
  pull.bind(address);
  const std::string endpoint = pull.get(zmq::sockopt::last_endpoint);
  push.connect(endpoint);
  std::vector<std::string> payloads(distinct ? static_cast<size_t>(n) : 1);
  for (size_t i = 0; i < payloads.size(); ++i) payloads[i].assign(bytes, static_cast<char>('a' + i % 26));
  // Warm the connection.
  push.send(zmq::buffer(payloads[0]));
  zmq::message_t msg;
  (void)pull.recv(msg);
  const auto use0 = thread_use();
  const double t0 = now_s(), c0 = cpu_s();
  std::thread producer([&] {
    ::pthread_setname_np(::pthread_self(), "rlx-raw-push");
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) push.send(zmq::buffer(payloads[i % payloads.size()]));
  });
  size_t got = 0;
  for (int i = 0; i < n; ++i) {
    (void)pull.recv(msg);
    got += msg.size();
  }
  const double dt = now_s() - t0;
  const auto use1 = thread_use();  // before the producer ends, to count it
  producer.join();
  RLX_CHECK(got == bytes * static_cast<size_t>(n), "raw bench lost bytes");
  return {dt, cpu_s() - c0, thread_use_per(use0, use1, n)};
}

struct BusResult {
  double ingest_s, drain_s;
  double ingest_cpu_s, drain_cpu_s;
  double ingest_faults, drain_faults;
  size_t frame_bytes;
  nlohmann::json ingest_threads;  // per thread: CPU us and context switches per group
};

// Groups through the hub: a worker submits `n` groups (ingest, until every ack), then a
// learner drains them (drain), asking for `prefetch` batches ahead. The learner reads each
// batch as the launcher's learner does: in place (next_batch_view), every frame checked.
BusResult bus_roundtrip(const std::string& address, const BenchArgs& a, int prefetch) {
  bus::HubOptions ho;
  ho.address = address;
  ho.group_size = static_cast<uint32_t>(a.samples);
  ho.max_leases_per_request = static_cast<uint32_t>(a.groups);
  ho.replay.capacity_groups = static_cast<size_t>(a.groups) + 8;
  ho.credits_per_peer = static_cast<uint32_t>(a.credits);
  ho.replay.max_staleness = 1000;
  std::vector<std::string> records;
  for (int i = 0; i < a.groups; ++i) records.push_back(fmt::format("{{\"prompt\":\"p{}\"}}", i));
  bus::Hub hub(ho, records);
  std::atomic<bool> stop{false};
  const std::string endpoint = hub.endpoint();
  std::thread hub_thread([&] {
    ::pthread_setname_np(::pthread_self(), "rlx-hub");
    hub.run(stop);
  });
  BusResult r{};
  try {
    bus::Client worker({.address = endpoint, .who = "bench-worker", .request_timeout_s = 120, .credit_wait_s = 120});
    auto grant = worker.request_leases(static_cast<uint32_t>(a.groups));
    RLX_CHECK(grant.leases.size() == static_cast<size_t>(a.groups), "bench: got {} leases", grant.leases.size());
    std::vector<bus::TrajectoryGroup> groups;
    for (const auto& l : grant.leases) groups.push_back(synthetic_group(l, a.tokens, 64));
    r.frame_bytes = bus::pack(groups.front()).size();
    const auto use0 = thread_use();
    const double t0 = now_s(), c0 = cpu_s(), f0 = page_faults();
    for (auto& g : groups) worker.submit(std::move(g));
    RLX_CHECK(worker.flush(120), "bench: groups not acknowledged");
    r.ingest_s = now_s() - t0;
    r.ingest_cpu_s = cpu_s() - c0;
    r.ingest_faults = page_faults() - f0;
    r.ingest_threads = thread_use_per(use0, thread_use(), a.groups);
    RLX_CHECK(worker.counters().verdicts["accepted"] == static_cast<uint64_t>(a.groups), "bench: not every group accepted");
    bus::Client learner(
        {.address = endpoint, .who = "bench-learner", .role = "learner", .request_timeout_s = 120, .prefetch_batches = prefetch});
    const double t1 = now_s(), c1 = cpu_s(), f1 = page_faults();
    size_t got = 0;
    while (got < static_cast<size_t>(a.groups))
      got += learner.next_batch_view({.max_groups = static_cast<uint32_t>(a.batch_groups)}, 120).groups.size();
    r.drain_s = now_s() - t1;
    r.drain_cpu_s = cpu_s() - c1;
    r.drain_faults = page_faults() - f1;
  } catch (...) {
    stop = true;
    hub_thread.join();
    throw;
  }
  stop = true;
  hub_thread.join();
  return r;
}

void add_bench_bus(CLI::App& app, Action& action) {
  auto* bench = app.get_subcommand("bench");
  auto a = std::make_shared<BenchArgs>();
  auto* c = bench->add_subcommand("bus", "Trajectory groups through the hub vs raw ZeroMQ PUSH/PULL (same bytes, same run)");
  c->add_option("--groups", a->groups, "trajectory groups per measurement")->capture_default_str();
  c->add_option("--samples", a->samples, "samples per group")->capture_default_str();
  c->add_option("--tokens", a->tokens, "tokens per sample")->capture_default_str();
  c->add_option("--transports", a->transports, "comma-separated: ipc, tcp")->capture_default_str();
  c->add_option("--credits", a->credits, "credits per worker")->capture_default_str();
  c->add_option("--batch-groups", a->batch_groups, "groups per learner batch while draining")->capture_default_str();
  c->add_option("--reps", a->reps, "measurements per path (after one warm-up each); medians reported")->capture_default_str();
  c->callback([a, &action] {
    action = [a] {
      bus::keep_frame_memory();
      log::set_level(log::Level::warn);
      nlohmann::json result = {{"bench", "bus"}, {"groups", a->groups}, {"samples", a->samples}, {"tokens", a->tokens}};
      a->batch_groups = std::min(a->batch_groups, a->groups);
      result["drain_batch_groups"] = a->batch_groups;
      RLX_CHECK(a->batch_groups > 0 && a->groups % a->batch_groups == 0, "--batch-groups {} must divide --groups {}",
                a->batch_groups, a->groups);
      std::stringstream ss(a->transports);
      for (std::string t; std::getline(ss, t, ',');) {
        RLX_CHECK(t == "ipc" || t == "tcp", "--transports: '{}' is not ipc or tcp", t);
        const std::string addr = t == "ipc" ? fmt::format("ipc:///tmp/rlx-bench-bus-{}.sock", ::getpid()) : "tcp://127.0.0.1:0";
        const std::string raw_addr = t == "ipc" ? fmt::format("ipc:///tmp/rlx-bench-raw-{}.sock", ::getpid()) : "tcp://127.0.0.1:0";
        // One untimed pass each warms the allocator and the sockets; then raw and bus
        // alternate so both see the same machine state.
        BusResult bus_r = bus_roundtrip(addr, *a, 0);
        (void)raw_push_pull(raw_addr, a->groups, bus_r.frame_bytes, true);
        nlohmann::json raw_threads;
        std::vector<double> raw_v, raw_hot_v, ingest_v, drain_v, raw_cpu_v, ingest_cpu_v, drain_cpu_v, ahead_v, ahead_cpu_v;
        for (int r = 0; r < std::max(1, a->reps); ++r) {
          const auto raw = raw_push_pull(raw_addr, a->groups, bus_r.frame_bytes, true);
          raw_v.push_back(raw.wall_s);
          raw_cpu_v.push_back(raw.cpu_s);
          raw_threads = raw.threads;  // the last measurement's
          raw_hot_v.push_back(raw_push_pull(raw_addr, a->groups, bus_r.frame_bytes, false).wall_s);
          const auto b = bus_roundtrip(addr, *a, 0), ahead = bus_roundtrip(addr, *a, 1);
          ahead_v.push_back(ahead.drain_s);
          ahead_cpu_v.push_back(ahead.drain_cpu_s);
          bus_r.ingest_threads = b.ingest_threads;  // the last measurement's
          bus_r.ingest_faults = b.ingest_faults;
          bus_r.drain_faults = b.drain_faults;
          ingest_v.push_back(b.ingest_s);
          drain_v.push_back(b.drain_s);
          ingest_cpu_v.push_back(b.ingest_cpu_s);
          drain_cpu_v.push_back(b.drain_cpu_s);
        }
        const double raw_s = median(raw_v), raw_hot_s = median(raw_hot_v);
        bus_r.ingest_s = median(ingest_v);
        bus_r.drain_s = median(drain_v);
        const double us_per = 1e6 / a->groups;  // CPU microseconds (all threads) per message
        const double bytes = static_cast<double>(bus_r.frame_bytes) * a->groups;
        nlohmann::json j = {{"frame_bytes", bus_r.frame_bytes},
                            {"raw_msgs_per_s", a->groups / raw_s},
                            {"raw_gb_per_s", bytes / raw_s / 1e9},
                            {"raw_hot_gb_per_s", bytes / raw_hot_s / 1e9},
                            {"ingest_msgs_per_s", a->groups / bus_r.ingest_s},
                            {"ingest_gb_per_s", bytes / bus_r.ingest_s / 1e9},
                            {"drain_msgs_per_s", a->groups / bus_r.drain_s},
                            {"drain_gb_per_s", bytes / bus_r.drain_s / 1e9},
                            {"ingest_vs_raw", raw_s / bus_r.ingest_s},
                            {"drain_vs_raw", raw_s / bus_r.drain_s},
                            {"drain_prefetch_gb_per_s", bytes / median(ahead_v) / 1e9},
                            {"drain_prefetch_vs_raw", raw_s / median(ahead_v)},
                            {"drain_prefetch_cpu_us_per_group", median(ahead_cpu_v) * us_per},
                            {"ingest_vs_raw_hot", raw_hot_s / bus_r.ingest_s},
                            {"drain_vs_raw_hot", raw_hot_s / bus_r.drain_s},
                            {"raw_cpu_us_per_msg", median(raw_cpu_v) * us_per},
                            {"ingest_cpu_us_per_group", median(ingest_cpu_v) * us_per},
                            {"drain_cpu_us_per_group", median(drain_cpu_v) * us_per},
                            {"ingest_page_faults_per_group", bus_r.ingest_faults / a->groups},
                            {"drain_page_faults_per_group", bus_r.drain_faults / a->groups},
                            {"raw_threads", raw_threads},
                            {"ingest_threads", bus_r.ingest_threads}};
        std::cerr << t << ": " << j.dump() << "\n";
        result[t] = j;
      }
      std::cout << result.dump() << std::endl;
      return 0;
    };
  });
}

}  // namespace

void add_bus_commands(CLI::App& app, Action& action) {
  add_hub_commands(app, action);
  add_keys_commands(app, action);
  add_inspect_trajectories(app, action);
  add_synthetic_peers(app, action);
  add_bench_bus(app, action);
}

}  // namespace rlx::cli
