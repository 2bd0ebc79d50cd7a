// A rollout worker's parts (worker_envs.hpp).
#include "worker_envs.hpp"

#include <link.h>

#include <algorithm>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/log.hpp"
#include "rlx/model/reward_model.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;

namespace {

// The shared libraries this process loaded (librlx, LibTorch, ...): the server is this binary,
// so its sandbox must show their directories (a pip-installed PyTorch's lie outside the
// sandbox's system directories: on the CUDA machine the server could not find libtorch.so), and
// its address-space limit must leave room for their segments (a CUDA build maps gigabytes).
struct LoadedLibraries {
  std::vector<fs::path> dirs;  // canonical, each once
  uint64_t mapped_bytes = 0;   // the loadable segments' sizes
};
LoadedLibraries loaded_libraries() {
  LoadedLibraries out;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto& libs = *static_cast<LoadedLibraries*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_LOAD) libs.mapped_bytes += info->dlpi_phdr[i].p_memsz + 4096;
        if (info->dlpi_name && info->dlpi_name[0] == '/') {
          std::error_code ec;
          const auto dir = fs::canonical(info->dlpi_name, ec).parent_path();
          if (!ec && std::find(libs.dirs.begin(), libs.dirs.end(), dir) == libs.dirs.end()) libs.dirs.push_back(dir);
        }
        return 0;
      },
      &out);
  return out;
}

// Whether `path` is `dir` or lies under it.
bool under(const fs::path& path, const fs::path& dir) {
  const auto rel = path.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

// Whether the run's environment runs code: it then gets a sandbox of its own inside the
// server, which runs outside one (namespaces do not nest under the sandbox's filter).
bool runs_code(const RunConfig& cfg) { return env::Registry::global().needs(cfg.env.name).runs_code; }

// An env server of this run: its command, sandbox, and ipc address. `name` names its
// socket's directory (worker-W.S).
struct EnvServerPlan {
  env::EnvServerProcess::Options process;
  std::string address;
};
EnvServerPlan env_server_plan(const RoleContext& ctx, const std::string& name) {
  const auto& e = ctx.cfg.env;
  // Each server's socket in a directory of its own: the sandbox makes its writable
  // paths its own user's, so servers (and the run directory) must not share one.
  const auto sock_dir = ctx.run_dir.env_server_dir(name);
  fs::create_directories(sock_dir);
  const auto sock = RunDir::env_socket(sock_dir);
  fs::copy_file(ctx.run_dir.tokenizer(), RunDir::env_tokenizer(sock_dir), fs::copy_options::overwrite_existing);
  EnvServerPlan plan{.address = "ipc://" + sock.string()};
  std::vector<std::string> argv{ctx.exe, "env", "serve", "--address", plan.address, "--tokenizer",
                                RunDir::env_tokenizer(sock_dir).string(), "--options", e.options_json().dump(),
                                "--seed", std::to_string(ctx.cfg.run.seed)};
  // The code's sandbox is the config's env.sandbox (limits and paths), as in the worker.
  if (runs_code(ctx.cfg)) argv.insert(argv.end(), {"--code-sandbox", "--code-sandbox-config", config::to_yaml(e.sandbox)});
  // The server's binary and its libraries must be visible (read-only) inside.
  // A server lives as long as the worker: the time limits bound one server's life,
  // a stuck call is caught by env.timeout_s.
  auto sandbox = e.sandbox;
  sandbox.limits.wall_s = sandbox.limits.cpu_s = 86400;
  // Every episode a worker runs at once holds a connection to its server (one descriptor
  // there): a grant of leases_per_request groups of group_size samples, spread over the servers.
  const uint64_t episodes = uint64_t{ctx.cfg.rollout.leases_per_request} * ctx.cfg.hub.group_size;
  const uint64_t per_server = (episodes + std::max(1u, e.servers) - 1) / std::max(1u, e.servers);
  sandbox.limits.open_files = static_cast<uint32_t>(
      std::min<uint64_t>(1 << 20, std::max<uint64_t>(sandbox.limits.open_files, 64 + 2 * per_server)));
  // Visible read-only: the binary's directory and its ../lib, and the directory of each
  // library this process loaded that the sandbox's own paths do not hold. Those directories
  // also lead LD_LIBRARY_PATH: a RUNPATH may name them another way (a pip PyTorch's reads
  // torch/share/../lib, and share is not mounted); the parent's LD_LIBRARY_PATH follows.
  const auto system = sandbox.readonly_paths;
  const auto visible = [](const std::vector<std::string>& paths, const fs::path& dir) {
    return std::any_of(paths.begin(), paths.end(), [&](const std::string& p) { return under(dir, p); });
  };
  const auto bin = fs::path(ctx.exe).parent_path();
  for (const auto& dir : {bin, bin.parent_path() / "lib"})
    if (fs::exists(dir) && !visible(sandbox.readonly_paths, dir)) sandbox.readonly_paths.push_back(dir.string());
  const LoadedLibraries libs = loaded_libraries();
  std::string library_path;
  for (const auto& dir : libs.dirs) {
    if (visible(system, dir)) continue;
    if (!visible(sandbox.readonly_paths, dir)) sandbox.readonly_paths.push_back(dir.string());
    library_path += (library_path.empty() ? "" : ":") + dir.string();
  }
  if (const char* ld = std::getenv("LD_LIBRARY_PATH"); ld && *ld)
    library_path += (library_path.empty() ? "" : ":") + std::string(ld);
  std::vector<std::string> env;
  if (!library_path.empty()) env.push_back("LD_LIBRARY_PATH=" + library_path);
  plan.process = {.argv = argv,
                  .rlx = ctx.exe,
                  .sandboxed = !runs_code(ctx.cfg),
                  .sandbox = sandbox,
                  .writable = {sock_dir.string()},
                  .env = env,
                  // The limit is on address space (RLIMIT_AS): env.sandbox's memory_mb for the
                  // server's own memory, and what its libraries map.
                  .library_mb = (libs.mapped_bytes >> 20) + 1,
                  .max_restarts = e.max_restarts};
  return plan;
}

}  // namespace

std::string check_env_server(const RoleContext& ctx, double timeout_s) {
  auto plan = env_server_plan(ctx, "check");
  plan.process.argv.insert(plan.process.argv.end(), {"--check", ctx.cfg.env.name});
  auto why = env::EnvServerProcess::trial(std::move(plan.process), timeout_s);
  std::error_code ec;
  (void)remove_tree(ctx.run_dir.env_server_dir("check"), ec);  // (never fs::remove_all: files.hpp)
  return why;
}

WorkerEnvs::WorkerEnvs(const RoleContext& ctx, std::shared_ptr<const Tokenizer> tok, std::function<bool()> cancel,
                       std::function<bool()> leave)
    : ctx_(ctx), tok_(std::move(tok)), cancel_(std::move(cancel)), leave_(std::move(leave)) {
  const auto& e = ctx.cfg.env;
  context_ = {.tokenizer = tok_.get(), .options = e.options_json(), .seed = ctx.cfg.run.seed};
  if (runs_code(ctx.cfg)) {  // (with servers, only to ask the environment for its stop strings)
    sandbox_ = std::make_unique<env::Sandbox>(e.sandbox);
    context_.sandbox = sandbox_.get();
  }
  for (uint32_t s = 0; s < e.servers; ++s) {
    auto plan = env_server_plan(ctx, fmt::format("worker-{}.{}", ctx.index, s));
    servers_.push_back(std::make_unique<env::EnvServerProcess>(std::move(plan.process)));
    addresses_.push_back(plan.address);
  }
}

rl::EnvSource WorkerEnvs::source() {
  return {.make = [this] { return make(); },
          .stop_strings = env::Registry::global().make(ctx_.cfg.env.name, context_)->stop_strings()};
}

std::unique_ptr<env::Env> WorkerEnvs::make() {
  const auto& e = ctx_.cfg.env;
  if (servers_.empty()) return env::Registry::global().make(e.name, context_);
  const size_t s = next_++ % servers_.size();
  servers_[s]->ensure_running();
  return std::make_unique<env::RemoteEnv>(env::RemoteEnvOptions{.address = addresses_[s], .env = e.name,
                                                                .timeout_s = e.timeout_s, .retries = e.retries,
                                                                .server = servers_[s].get(), .cancel = cancel_,
                                                                .leave = leave_});
}

EngineConfig engine_config(const RunConfig& cfg) {
  return {.block_size = static_cast<int32_t>(cfg.rollout.block_size),
          .kv_cache_blocks = cfg.rollout.kv_cache_blocks,
          .max_batch_tokens = cfg.rollout.max_batch_tokens,
          .max_running = cfg.rollout.max_running,
          .update_policy = cfg.rollout.update_policy == RolloutUpdatePolicy::continue_ ? UpdatePolicy::continue_
                                                                                       : UpdatePolicy::finish_old,
          .cuda_graphs = cfg.rollout.cuda_graphs,
          .record_routing = cfg.rollout.record_routing};
}

rl::RolloutOptions rollout_options(const RunConfig& cfg) {
  const auto& r = cfg.rollout;
  return {.max_turns = cfg.env.max_turns,
          .sampling = {.temperature = r.temperature,
                       .top_k = r.top_k,
                       .top_p = r.top_p,
                       .min_p = r.min_p,
                       .max_new_tokens = r.max_new_tokens,
                       .stop_strings = r.stop},
          .seed = r.seed >= 0 ? static_cast<uint64_t>(r.seed) : cfg.run.seed};
}

rl::WorkerOptions worker_options(const RoleContext& ctx, const std::string& who, int64_t vocab_size) {
  const auto& cfg = ctx.cfg;
  rl::WorkerOptions o{.who = who,
                           .rollout = rollout_options(cfg),
                           .leases_per_request = cfg.rollout.leases_per_request,
                           .weights_timeout_s = cfg.train.batch_timeout_s,
                           .episode_dir = ctx.run_dir.episodes(),
                           .episode_checkpoint_turns = cfg.rollout.episode_checkpoint_turns};
  const auto& rm = cfg.reward_model;
  if (!rm.path.empty()) {
    // The reward model beside the engine, on its device and in its dtype.
    auto model = std::make_shared<RewardModel>(
        RewardModel::load(rm.path, {.dtype = to_scalar_type(cfg.model.dtype), .device = at::Device(cfg.model.device)}));
    RLX_CHECK(model->body().config().vocab_size == vocab_size,
              "reward_model.path {}: its vocabulary ({} tokens) is not the policy's ({}): it scores the policy's tokens, "
              "so both need the same tokenizer",
              rm.path, model->body().config().vocab_size, vocab_size);
    o.score = [model, batch = rm.max_batch_tokens](const std::vector<std::vector<int64_t>>& seqs) {
      return model->score(seqs, batch);
    };
    o.score_coef = rm.coef;
    o.env_coef = rm.env_coef;
    log::info("{}: reward model {} ({} layers, hidden {}); reward = {} x env + {} x score", who, rm.path,
              model->body().config().num_layers, model->body().config().hidden_size, rm.env_coef, rm.coef);
  }
  return o;
}

}  // namespace rlx::launch
