// rlx hub serve CONFIG [key=value ...]     run the replay hub (the `hub:` section); SIGTERM saves and stops
// rlx hub stats|save|stop --address A      ask a running hub
// rlx keys generate --out DIR --name NAME  a CURVE key pair: NAME.key (secret) and NAME.pub
// rlx inspect trajectories FILE.h5         summary of a trajectory store; --dump N prints records
// rlx bus worker / rlx bus learner         synthetic peers: load a hub, or test it with real processes
// (rlx bench bus is in bench_bus.cpp.)
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

#include "bus_commands.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/bus/client.hpp"
#include "rlx/bus/h5store.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/log.hpp"
#include "rlx/launch/config.hpp"
#include "rlx/learner/batching.hpp"

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
        else client.control(cmd == "save" ? bus::ControlCommand::save : bus::ControlCommand::stop);
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
    std::string file, upgrade_to;
    uint64_t dump = 0, first = 0;
  };
  auto args = std::make_shared<Args>();
  auto* c = inspect->add_subcommand("trajectories", "Summarize an HDF5 trajectory store (rlx hub's trajectory_file), also while the hub writes it");
  c->add_option("file", args->file, "the .h5 file")->required();
  c->add_option("--dump", args->dump, "also print this many groups as JSON lines");
  c->add_option("--first", args->first, "the first group to dump");
  c->add_option("--upgrade-to", args->upgrade_to,
                "write FILE's groups (an older trajectory format) to this new file in this build's format, then show it");
  c->callback([args, &action] {
    action = [args] {
      if (!args->upgrade_to.empty()) {
        const auto n = bus::upgrade_trajectories(args->file, args->upgrade_to);
        std::cerr << fmt::format("upgraded {} groups from {} to {}\n", n, args->file, args->upgrade_to);
        args->file = args->upgrade_to;
      }
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
                                   {"versions", t.versions.per_token()}, {"prompt_len", t.prompt_len}, {"reward", t.reward},
                                   {"finish", t.finish}, {"metadata", t.metadata}});
        for (size_t i = 0; i < g.samples.size(); ++i)  // a mixture-of-experts sample's routing, per token
          if (const auto& r = g.samples[i].routing; !r.empty())
            gj["samples"][i]["routing"] = {{"layers", r.layers}, {"top_k", r.top_k}, {"experts", r.experts}};
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
        const auto b = c.next_batch_view({.max_groups = l->batch_groups}, l->peer.timeout_s);
        std::vector<int64_t> tokens;
        for (const auto& g : b.groups) tokens.push_back(g.num_tokens());
        const auto rank_of = assign_ranks(tokens, l->ranks);  // as the learner splits a batch
        for (size_t i = 0; i < b.groups.size(); ++i) {
          const auto& g = b.groups[i];
          if (out.is_open())
            out << nlohmann::json{{"lease_id", g.lease_id}, {"prompt_index", g.prompt_index}, {"epoch", g.epoch},
                                  {"worker", std::string(g.worker)}, {"rank", rank_of[i]}, {"batch", b.batch_id}}.dump()
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

}  // namespace

bus::TrajectoryGroup synthetic_group(const bus::Lease& lease, int tokens, int prompt_len) {
  bus::TrajectoryGroup g{.lease_id = lease.lease_id, .prompt_index = lease.prompt_index, .epoch = lease.epoch};
  for (uint32_t s = 0; s < lease.group_size; ++s) {
    bus::Trajectory t;
    t.prompt_len = std::min(prompt_len, tokens);
    t.tokens.resize(static_cast<size_t>(tokens));
    t.loss_mask.assign(static_cast<size_t>(tokens), 1);
    t.logprobs.assign(static_cast<size_t>(tokens), -1.0f);
    t.versions = bus::TokenVersions(static_cast<size_t>(t.prompt_len), -1);
    t.versions.append(lease.min_version, static_cast<uint64_t>(tokens - t.prompt_len));
    for (int i = 0; i < tokens; ++i) {
      t.tokens[static_cast<size_t>(i)] = static_cast<int32_t>((lease.prompt_index * 31 + s * 7 + static_cast<uint64_t>(i)) % 50000);
      if (i < t.prompt_len) t.loss_mask[static_cast<size_t>(i)] = 0, t.logprobs[static_cast<size_t>(i)] = 0;
    }
    t.reward = static_cast<float>((lease.prompt_index + s) % 2);
    t.finish = "stop";
    t.metadata = fmt::format("{{\"prompt_index\":{}}}", lease.prompt_index);
    g.samples.push_back(std::move(t));
  }
  return g;
}

void add_bus_commands(CLI::App& app, Action& action) {
  add_hub_commands(app, action);
  add_keys_commands(app, action);
  add_inspect_trajectories(app, action);
  add_synthetic_peers(app, action);
  add_bench_bus(app, action);
}

}  // namespace rlx::cli
