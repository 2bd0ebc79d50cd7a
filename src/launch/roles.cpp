#include "rlx/launch/roles.hpp"

#include "role_common.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "rlx/bus/hub.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/status.hpp"
#include "rlx/core/trace.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_broadcast.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/model/hf.hpp"
namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path socket_dir(const fs::path& run_dir) {
  // The longest name below it: env-sockets/worker-WWWW.SSSS/env.sock.
  constexpr size_t kMaxSocketPath = 107, kLongestName = 40;
  if (run_dir.string().size() + kLongestName <= kMaxSocketPath) return run_dir;
  return fs::temp_directory_path() /
         fmt::format("rlx-{}-{:016x}", run_dir.filename().string().substr(0, 24), hash_name(run_dir.string()));
}

std::string RoleContext::hub_address() const {
  if (!tcp) return "ipc://" + (socket_dir(run_dir) / "hub.sock").string();
  return dist::wait_endpoint_file(run_dir / kHubEndpointFile, cfg.train.batch_timeout_s);
}

WeightSync RoleContext::weight_sync() const {
  if (cfg.train.weight_sync != WeightSync::auto_) return cfg.train.weight_sync;
  return tcp ? WeightSync::tcp : WeightSync::shm;
}

// The broadcast path's options for this run, both ends: loopback on one host; the group
// waits for a member as long as the launcher waits for its heartbeat (a member silent
// longer is killed and restarted anyway).
static dist::BroadcastSyncOptions broadcast_options(const RoleContext& ctx) {
  dist::BroadcastSyncOptions o;
  o.bind = ctx.tcp ? "tcp://0.0.0.0:0" : "tcp://127.0.0.1:0";
  o.advertise_host = ctx.tcp ? "" : "127.0.0.1";
  o.endpoint_file = ctx.run_dir / kBroadcastEndpointFile;
  o.bucket_mb = ctx.cfg.train.weight_bucket_mb;
  o.timeout_s = std::max(10.0, ctx.cfg.train.heartbeat_timeout_s);
  const bool cuda = ctx.cfg.model.device.starts_with("cuda");
  o.nccl = cuda && dist::nccl_available();
  o.device = o.nccl ? ctx.cfg.model.device : "cpu";
  return o;
}

std::unique_ptr<dist::WeightPublisher> RoleContext::weight_publisher(const dist::WeightLayout& layout) const {
  switch (weight_sync()) {
    case WeightSync::broadcast:
      return std::make_unique<dist::BroadcastWeightPublisher>(broadcast_options(*this), layout);
    case WeightSync::tcp:
      return std::make_unique<dist::TcpWeightPublisher>(
          dist::TcpSyncOptions{.bind = "tcp://0.0.0.0:0", .endpoint_file = run_dir / kWeightsEndpointFile}, layout);
    default:
      // On a CUDA device the two slots are device buffers the workers map (CUDA IPC): a split
      // run on one GPU moves its weights device to device.
      return std::make_unique<dist::ShmWeightPublisher>(
          dist::ShmSyncOptions{.name = weights, .device = cfg.model.device.starts_with("cuda") ? cfg.model.device : "cpu"},
          layout);
  }
}

std::unique_ptr<dist::WeightSubscriber> RoleContext::weight_subscriber(std::function<bool()> give_up) const {
  // The learner may still be loading its checkpoint: wait as long as for a batch.
  const double attach_s = std::max(120.0, cfg.train.batch_timeout_s);
  switch (weight_sync()) {
    case WeightSync::broadcast: {
      auto o = broadcast_options(*this);
      o.attach_timeout_s = attach_s;
      o.give_up = std::move(give_up);
      return std::make_unique<dist::BroadcastWeightSubscriber>(std::move(o));
    }
    case WeightSync::tcp:
      return std::make_unique<dist::TcpWeightSubscriber>(dist::TcpSyncOptions{
          .endpoint_file = run_dir / kWeightsEndpointFile, .attach_timeout_s = attach_s, .give_up = std::move(give_up)});
    default:
      return std::make_unique<dist::ShmWeightSubscriber>(
          dist::ShmSyncOptions{.name = weights, .attach_timeout_s = 120, .give_up = std::move(give_up)});
  }
}

std::shared_ptr<const Tokenizer> run_tokenizer(const RunConfig& cfg) {
  if (!cfg.tokenizer.path.empty()) return load_tokenizer(cfg.tokenizer.path);
  if (!cfg.model.path.empty()) return load_tokenizer(fs::path(cfg.model.path) / "tokenizer.json");
  return std::make_shared<CharTokenizer>(default_char_alphabet());
}

std::shared_ptr<Transformer> initial_model(const RunConfig& cfg, const Tokenizer& tokenizer) {
  const auto dtype = to_scalar_type(cfg.model.dtype);
  if (!cfg.model.path.empty()) return load_hf(cfg.model.path, {.dtype = dtype, .device = at::Device(cfg.model.device)});
  auto mc = model_preset(cfg.model.preset, cfg.model.arch);
  mc.vocab_size = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : tokenizer.vocab_size();
  auto model = std::make_shared<Transformer>(mc, dtype, at::Device(cfg.model.device));
  model->init_weights(cfg.run.seed);
  return model;
}

void add_engine_adapters(Transformer& model, const RunConfig& cfg) {
  if (cfg.model.lora.enabled())
    model.add_lora(cfg.model.lora, cfg.rollout.lora_merged ? LoraMode::merged : LoraMode::unmerged);
}

fs::path fault_marker(const fs::path& run_dir) { return run_dir / "fault-injected"; }

fs::path heartbeat_file(const fs::path& run_dir, const std::string& role, int index) {
  return run_dir / "heartbeats" / fmt::format("{}-{}", role, index);
}

void start_heartbeat(const fs::path& run_dir, const std::string& role, int index) {
  const auto file = heartbeat_file(run_dir, role, index);
  fs::create_directories(file.parent_path());
  status::set("starting");
  std::thread([file] {
    for (;;) {
      // Replaced whole (not durable: a beat is news, not state): its mtime is the beat, its
      // text what the role is doing. A failed write (a full disk) is a beat missed.
      const auto now = status::get();
      const auto text = json{{"pid", ::getpid()}, {"status", now.what}, {"since", now.since}, {"ready", now.ready}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      try {
        write_file_atomic(file, text, /*durable=*/false);
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }).detach();
}

RoleBeat read_heartbeat(const fs::path& run_dir, const std::string& role, int index) {
  RoleBeat b;
  const auto file = heartbeat_file(run_dir, role, index);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return b;
  b.beat = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
  std::ifstream in(file);
  const auto j = json::parse(in, nullptr, false);
  if (!j.is_object()) return b;
  b.pid = j.value("pid", int64_t{0});
  b.status = j.value("status", std::string());
  b.since = j.value("since", 0.0);
  b.ready = j.value("ready", false);
  return b;
}

fs::path failure_file(const fs::path& run_dir, const std::string& role, int index) {
  return run_dir / "failures" / fmt::format("{}-{}", role, index);
}

void start_trace(const RoleContext& ctx, const std::string& role) {
  if (!ctx.cfg.trace.enabled) return;
  const auto dir = ctx.run_dir / "traces";
  fs::create_directories(dir);
  TraceWriter::install(std::make_shared<TraceWriter>((dir / fmt::format("{}-{}.{}.json", role, ctx.index, ::getpid())).string(),
                                                     fmt::format("{} {}", role, ctx.index)));
}

size_t merge_traces(const fs::path& run_dir) {
  const auto dir = run_dir / "traces";
  if (!fs::exists(dir)) return 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::ostringstream out;
  out << "[\n";
  size_t events = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    // One event per line; a process killed mid-write leaves its last line cut: skipped.
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == ',' || line.back() == ' ')) line.pop_back();
      if (line.empty() || line[0] != '{') continue;
      if (json::parse(line, nullptr, false).is_discarded()) continue;
      out << (events++ > 0 ? ",\n" : "") << line;
    }
  }
  out << "\n]\n";
  write_file_atomic(run_dir / "trace.json", out.str(), /*durable=*/false);
  return events;
}

void write_tokenizer(const RunConfig& cfg, const fs::path& file) {
  if (const auto tok = run_tokenizer(cfg); auto* ct = dynamic_cast<const CharTokenizer*>(tok.get()))
    ct->save(file);
  else
    fs::copy_file(cfg.tokenizer.path.empty() ? fs::path(cfg.model.path) / "tokenizer.json" : fs::path(cfg.tokenizer.path),
                  file, fs::copy_options::overwrite_existing);
}

// Threads per process: the configured number, else the cores shared among the roles.
void set_threads(const RunConfig& cfg) {
  // Colocated, the learner's process rolls out too: taking turns (sync) one compute thread
  // at a time, overlapping (async) two, each with its share of the cores.
  const bool overlap = cfg.train.placement == Placement::colocated && cfg.train.mode == TrainMode::async;
  const auto procs = worker_processes(cfg) + cfg.train.learner_ranks + (overlap ? 1 : 0);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_compute_threads(cfg.run.threads > 0 ? cfg.run.threads : std::max(1, cores / static_cast<int>(procs)));
}

namespace {

bus::HubOptions hub_options(const RoleContext& ctx) {
  auto o = ctx.cfg.hub;
  o.address = ctx.tcp ? "tcp://0.0.0.0:0" : ctx.hub_address();
  // Leases run at most max_staleness versions ahead of the learner; synchronous mode is
  // on-policy: every group of step k is sampled by version k - 1.
  if (o.groups_per_version == 0) o.groups_per_version = ctx.cfg.train.groups_per_step;
  if (ctx.cfg.train.mode == TrainMode::sync) o.replay.max_staleness = 0;
  if (o.trajectory_file.empty()) o.trajectory_file = (ctx.run_dir / "trajectories.h5").string();
  if (o.state_file.empty()) o.state_file = (ctx.run_dir / "hub.state").string();
  return o;
}

}  // namespace

bool launcher_gone() {
  const char* p = std::getenv("RLX_LAUNCHER_PID");
  return p && ::getppid() != std::atoi(p);
}

double peak_memory_mb(const RunConfig& cfg) {
  const auto device_peak = compat::device_peak_bytes(at::Device(cfg.model.device));
  if (device_peak >= 0) return static_cast<double>(device_peak) / (1024.0 * 1024.0);
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::atomic<bool> g_stop{false};
namespace {
extern "C" void on_stop(int) { g_stop = true; }
}  // namespace
void install_stop_handler() { on_stop_signals(on_stop); }

int run_hub(const RoleContext& ctx) {
  set_compute_threads(1);
  auto o = hub_options(ctx);
  if (!ctx.tcp) fs::create_directories(socket_dir(ctx.run_dir));  // /tmp/rlx-NAME-HASH for a deep run directory
  std::unique_ptr<bus::Hub> hub;
  if (!o.dataset.empty()) {
    hub = std::make_unique<bus::Hub>(o);
  } else {  // tasks from the environment's own generator
    env::register_bundled();
    std::vector<std::string> records;
    const auto options = ctx.cfg.env.options_json();
    for (uint64_t i = 0; i < ctx.cfg.train.generated_tasks; ++i)
      records.push_back(env::Registry::global().generate(ctx.cfg.env.name, ctx.cfg.run.seed, i, options).dump());
    hub = std::make_unique<bus::Hub>(o, std::move(records));
  }
  // SIGTERM (from the launcher, after the learner's last checkpoint) saves and stops; a
  // terminal's SIGINT is the launcher's to handle.
  install_stop_handler();
  ::signal(SIGINT, SIG_IGN);
  if (ctx.tcp) {  // peers on any host find it by the run directory's hub.endpoint
    const auto bound = hub->endpoint();
    write_file_atomic(ctx.run_dir / kHubEndpointFile,
                      fmt::format("tcp://{}:{}\n", dist::host_name(), bound.substr(bound.rfind(':') + 1)));
  }
  log::info("hub: serving {} ({} groups of {} per step)", hub->endpoint(), ctx.cfg.train.groups_per_step,
            o.group_size);
  status::set(fmt::format("serving {}", hub->endpoint()));
  status::ready();
  hub->run(g_stop);
  std::map<std::string, double> st;
  for (const auto& [k, v] : hub->stats()) st[k] = v;
  log::info("hub: stopped; {:.0f} groups accepted, {:.0f} leases outstanding; state saved",
            st["accepted_total"], st["leases_outstanding"]);
  return 0;
}

}  // namespace rlx::launch
