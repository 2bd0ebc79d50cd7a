// rlx inspect checkpoint DIR      what a checkpoint holds, verified against its manifest
//                                 (DIR: one step_N directory, or a root holding several)
// rlx bench learner [...]         training-step figures of the sharded learner, 1 and N ranks
// rlx dist run --nproc N -- CMD   N local ranks of CMD with the rendezvous set up (like torchrun)
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <csignal>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iostream>
#include <thread>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "commands.hpp"
#include "rlx/bus/hub.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/dist/local_group.hpp"
#include "rlx/dist/weight_sync.hpp"
#include "rlx/learner/checkpoint.hpp"
#include "op_profile.hpp"

namespace rlx::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int inspect_checkpoint(const fs::path& dir, bool as_json) {
  std::vector<fs::path> dirs;
  if (fs::exists(dir / "MANIFEST.json") || fs::exists(dir / "learner.json") ||
      dir.filename().string().rfind("step_", 0) == 0)
    dirs.push_back(dir);
  else
    dirs = list_checkpoints(dir);
  RLX_CHECK(!dirs.empty(), "{}: no checkpoint (neither a step_N directory nor a directory holding them)", dir.string());
  bool all_ok = true;
  json out = json::array();
  for (const auto& d : dirs) {
    auto info = verify_checkpoint(d);
    all_ok = all_ok && info.ok;
    if (as_json) {
      json j = {{"dir", d.string()}, {"ok", info.ok}, {"step", info.step}, {"world_size", info.world_size}};
      if (!info.ok) j["problem"] = info.problem;
      if (info.ok) j["references"] = info.learner.value("references", json::object());
      out.push_back(j);
      continue;
    }
    std::cout << fmt::format("{}: {}\n", d.string(), info.ok ? "ok (every file matches the manifest)" : "NOT USABLE: " + info.problem);
    if (!info.ok) continue;
    const auto& lj = info.learner;
    const auto& m = lj.at("model");
    std::cout << fmt::format("  step {}, written by {} rank(s)\n", info.step, info.world_size);
    std::cout << fmt::format("  model: {} layers, hidden {}, vocab {}\n", m.value("num_hidden_layers", 0),
                             m.value("hidden_size", 0), m.value("vocab_size", 0));
    int64_t params = 0;
    for (const auto& u : lj.at("units")) params += u.at("numel").get<int64_t>();
    std::cout << fmt::format("  {} units, {} parameters (fp32 masters + AdamW moments)\n", lj.at("units").size(), params);
    const auto& o = lj.at("optimizer");
    std::cout << fmt::format("  optimizer: AdamW lr {} betas ({}, {}) eps {} weight_decay {}, {} steps taken\n",
                             o.at("lr").get<double>(), o.at("beta1").get<double>(), o.at("beta2").get<double>(),
                             o.at("eps").get<double>(), o.at("weight_decay").get<double>(), o.at("step").get<int64_t>());
    const json refs = lj.value("references", json::object());
    for (const auto& [k, v] : refs.items())
      std::cout << fmt::format("  reference {}: {}\n", k, v.dump());
    for (const auto& f : info.files)
      std::cout << fmt::format("  {:<36} {:>12} bytes  xxh64 {:016x}\n", f.name, f.bytes, f.xxh64);
  }
  if (as_json) std::cout << out.dump() << "\n";
  return all_ok ? 0 : kExitFailure;
}

struct LearnerBenchArgs {
  std::string preset = "small", arch = "qwen2", dtype = "float32", device = "cpu";
  int64_t seq = 256, batch_seqs = 8, micro_batch_tokens = 2048, steps = 3;
  int64_t row_tokens = 0;   // packed row length (0: --seq, one sequence a row)
  int64_t loss_tokens = 0;  // the loss on each sequence's last N tokens only, as on an RL sample's completion (0: all)
  int64_t group_size = 1;   // sequences in groups of N with the same untrained tokens (one prompt's samples)
  bool share_prefix = true; // learner.share_prefix
  bool head_on_loss_tokens = true;  // LearnerOptions::head_on_loss_tokens
  std::vector<int> ranks{1, 2};
  int threads = 0;
  int64_t profile_steps = 0;  // steps after the timed ones under LibTorch's profiler
  std::string trace_dir;      // then one more step under the kernel trace (rank 0's kernels.csv)
  int64_t lora_rank = 0;      // > 0: train LoRA adapters of this rank on every projection only
  bool checkpointing = false, as_rank = false;
};

// Measured GEMM throughput, the "peak" MFU is relative to: fp32 on this process's threads,
// or on a CUDA device a large product in the compute dtype.
double gemm_gflops(at::Device device, at::ScalarType dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto o = at::TensorOptions().device(device).dtype(device.is_cuda() ? dtype : at::kFloat);
  auto a = at::randn({n, n}, o), b = at::randn({n, n}, o);
  auto sync = [&] { (void)at::mm(a.narrow(0, 0, 1), b.narrow(1, 0, 1)).cpu(); };
  // Warm-up (clocks up, the GEMM's kernel chosen), then back-to-back products with one sync
  // at the end, as a GEMM-peak measurement does (a sync per product reads ~15% low on a GPU).
  for (int i = 0; i < 3; ++i) at::mm(a, b);
  sync();
  const double t0 = now_s();
  int k = 0;
  while (now_s() - t0 < 1.0 || k < 3) {
    for (int i = 0; i < (device.is_cuda() ? 20 : 1); ++i, ++k) at::mm(a, b);
    sync();
  }
  return 2.0 * static_cast<double>(n * n * n) * k / (now_s() - t0) / 1e9;
}

// Training FLOPs per token (forward + backward = 3x forward): 6 per matmul weight a token
// uses (a sparse layer's router and its top-k experts), plus attention scores and values
// (12 * layers * heads * head_dim * context).
double train_flops_per_token(const ModelConfig& c, double context) {
  const double q = static_cast<double>(c.num_heads * c.head_dim);
  // The active parameters less the embedding table and the norms: what the matmuls read.
  double matmul = static_cast<double>(c.num_active_parameters() - c.vocab_size * c.hidden_size);
  if (!c.tie_word_embeddings) matmul -= static_cast<double>(c.vocab_size * c.hidden_size);
  matmul += static_cast<double>(c.hidden_size * c.vocab_size);  // the LM head
  return 6 * matmul + 12 * static_cast<double>(c.num_layers) * q * context;
}

int64_t parameter_count(const ModelConfig& cfg) {
  int64_t n = 0;
  for (auto& [name, p] : Transformer(cfg).hf_parameters()) n += p.numel();
  return n;
}

json bench_rank(const LearnerBenchArgs& a) {
  auto comm = dist::connect(dist::rendezvous_from_env());
  const auto plan = set_compute_threads(a.threads);
  const auto cfg = model_preset(a.preset, *config::enum_from_string<Arch>(a.arch));
  LearnerOptions o;
  o.packing.row_tokens = std::max(a.row_tokens, a.seq);
  o.packing.micro_batch_tokens = std::max(a.micro_batch_tokens, o.packing.row_tokens);
  o.packing.share_prefix = a.share_prefix;
  o.head_on_loss_tokens = a.head_on_loss_tokens;
  o.fsdp.activation_checkpointing = a.checkpointing;
  o.fsdp.compute_dtype = to_scalar_type(*config::enum_from_string<DType>(a.dtype));
  o.fsdp.device = at::Device(a.device);
  o.fsdp.lora.rank = a.lora_rank;
  Learner learner(cfg, *comm, o);
  learner.init_weights(0);
  auto peak = at::tensor({gemm_gflops(o.fsdp.device, o.fsdp.compute_dtype)}, at::kDouble);
  comm->all_reduce(peak, dist::ReduceOp::sum, "bench: gemm peak")->wait();
  RngStream rng(1, 0);
  std::vector<double> times;
  int64_t tokens = 0, run_tokens = 0;
  cli::OpProfile profiler;
  std::vector<cli::OpTime> ops;
  cli::KernelTrace trace;
  json trace_summary = nullptr;
  const int64_t traced = a.steps + a.profile_steps + 1;  // the kernel trace's step, if --trace
  for (int64_t s = 0; s <= a.steps + a.profile_steps + (a.trace_dir.empty() ? 0 : 1); ++s) {  // step 0: warm-up
    if (s == a.steps + 1 && a.profile_steps > 0) profiler.start(o.fsdp.device.is_cuda());
    if (s == traced && a.profile_steps > 0) ops = profiler.stop();
    if (s == traced && comm->rank() == 0) trace.start(o.fsdp.device.is_cuda());
    std::vector<Sequence> mine;
    Sequence q;
    for (int64_t i = 0; i < a.batch_seqs; ++i) {
      // A group's sequences differ only in their trained tokens (a new group: new tokens throughout).
      const bool fresh = i % a.group_size == 0;
      q.tokens.resize(static_cast<size_t>(a.seq));
      q.loss_mask.resize(static_cast<size_t>(a.seq));
      for (int64_t t = 0; t < a.seq; ++t) {
        const bool trained = a.loss_tokens == 0 || t >= a.seq - a.loss_tokens;
        if (fresh || trained) q.tokens[static_cast<size_t>(t)] = rng.uniform_int(0, cfg.vocab_size - 1);
        q.loss_mask[static_cast<size_t>(t)] = trained ? 1 : 0;
      }
      if ((i / a.group_size) % comm->size() == comm->rank()) mine.push_back(q);  // a group on one rank
    }
    auto r = learner.step(mine, [](const MicroBatch& mb, const TokenOutputs& out, const StepContext& ctx, MetricSums&) {
      return -(out.logprobs * mb.loss_mask).sum() / ctx.global_loss_tokens;
    });
    if (s == traced && comm->rank() == 0) {
      compat::synchronize(o.fsdp.device);
      trace_summary = trace.stop(a.trace_dir);
    }
    if (s > 0 && s <= a.steps) {
      times.push_back(r.seconds);
      tokens = a.batch_seqs * a.seq;
      run_tokens = r.tokens;  // every token the model ran, forward and backward (a shared prompt once)
    }
  }
  json profile = nullptr;
  if (a.profile_steps > 0) {
    if (a.trace_dir.empty()) ops = profiler.stop();
    profile = cli::OpProfile::to_json(ops, 40, static_cast<double>(a.profile_steps));
  }
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];
  auto rss = at::tensor({peak_rss_mb()}, at::kDouble);
  comm->all_reduce(rss, dist::ReduceOp::max, "bench: peak memory")->wait();
  const double device_peak_mb = static_cast<double>(compat::device_peak_bytes(o.fsdp.device)) / (1 << 20);
  auto ran = at::tensor({static_cast<double>(run_tokens)}, at::kDouble);
  comm->all_reduce(ran, dist::ReduceOp::sum, "bench: tokens run")->wait();
  // The model's FLOPs are those of the tokens it ran; tokens/s counts the sequences' tokens.
  const double flops = train_flops_per_token(cfg, static_cast<double>(a.seq) / 2) * ran.item<double>();
  const double achieved = flops / step_s / 1e9;
  return {{"ranks", comm->size()},
          {"threads_per_rank", plan.threads()},
          {"tokens_per_step", tokens},
          {"tokens_run_per_step", ran.item<double>()},
          {"step_s", step_s},
          {"step_s_min", times.front()},
          {"lora_rank", a.lora_rank},
          {"tokens_per_s", static_cast<double>(tokens) / step_s},
          {"peak_rss_mb", rss.item<double>()},
          {"model_gflops_per_step", flops / 1e9},
          {"achieved_gflops", achieved},
          {"gemm_peak_gflops", peak.item<double>()},
          {"mfu", achieved / peak.item<double>()},
          {"device_peak_mb", device_peak_mb >= 0 ? json(device_peak_mb) : json(nullptr)},
          {"profile", profile},
          {"trace", trace_summary}};
}

int bench_learner(const LearnerBenchArgs& a, const std::vector<std::string>& self_args) {
  if (a.as_rank) {
    auto j = bench_rank(a);
    if (dist::rendezvous_from_env().rank == 0) std::cout << j.dump() << std::endl;
    return 0;
  }
  const auto cfg = model_preset(a.preset, *config::enum_from_string<Arch>(a.arch));
  json runs = json::array();
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  for (int n : a.ranks) {
    RLX_CHECK(n >= 1 && n <= 64, "--ranks: {} is not in [1, 64]", n);
    auto tmp = fs::temp_directory_path() / fmt::format("rlx-bench-learner-{}-{}", ::getpid(), n);
    std::vector<std::string> argv{"/proc/self/exe"};
    argv.insert(argv.end(), self_args.begin(), self_args.end());
    argv.push_back("--as-rank");
    argv.push_back(fmt::format("--threads={}", a.threads > 0 ? a.threads : std::max(1L, cores / n)));
    dist::LocalGroup g({.world_size = n, .argv = argv, .log_dir = tmp});
    const auto& exits = g.wait(3600);
    for (int r = 0; r < n; ++r) {
      const auto& e = exits[static_cast<size_t>(r)];
      RLX_CHECK(e.ok(), "bench learner: rank {} of {} failed ({}): {}", r, n, e.describe(), read_file(e.err, 1 << 20));
    }
    auto out = read_file(exits[0].out, 1 << 20);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    auto run = json::parse(out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1));
    std::cerr << fmt::format("{} rank(s): {:.0f} tokens/s, step {:.3f} s, peak {:.0f} MB/rank, MFU {:.1f}% of the measured GEMM peak\n",
                             n, run["tokens_per_s"].get<double>(), run["step_s"].get<double>(),
                             run["peak_rss_mb"].get<double>(), 100 * run["mfu"].get<double>());
    if (!run["profile"].is_null())
      std::cerr << fmt::format("rank 0, operators per step over {} profiled steps:\n{}", a.profile_steps,
                               cli::OpProfile::table(run["profile"]));
    runs.push_back(run);
    rlx::remove_tree(tmp);
  }
  json j = {{"bench", "learner"},
            {"preset", a.preset},
            {"arch", a.arch},
            {"dtype", a.dtype},
            {"device", a.device},
            {"seq", a.seq},
            {"batch_seqs", a.batch_seqs},
            {"row_tokens", std::max(a.row_tokens, a.seq)},
            {"loss_tokens", a.loss_tokens},
            {"group_size", a.group_size},
            {"share_prefix", a.share_prefix},
            {"head_on_loss_tokens", a.head_on_loss_tokens},
            {"micro_batch_tokens", a.micro_batch_tokens},
            {"activation_checkpointing", a.checkpointing},
            {"parameters", parameter_count(cfg)},
            {"runs", runs}};
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

void add_learner_commands(CLI::App& app, Action& action) {
  auto* inspect = app.get_subcommand("inspect");
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto* ck = inspect->add_subcommand("checkpoint", "Verify a checkpoint (or every one under a directory) and show what it holds");
  ck->add_option("dir", *dir, "a step_N checkpoint directory, or the directory holding them")->required();
  ck->add_flag("--json", *as_json, "one JSON line");
  ck->callback([dir, as_json, &action] { action = [dir, as_json] { return inspect_checkpoint(*dir, *as_json); }; });

  auto a = std::make_shared<LearnerBenchArgs>();
  auto* b = app.get_subcommand("bench")->add_subcommand(
      "learner", "Training steps of the sharded learner (1 and N local ranks): tokens/s, step time, peak memory, MFU");
  b->add_option("--preset", a->preset, "model preset");
  add_arch_option(*b, a->arch);
  b->add_option("--dtype", a->dtype, "compute dtype: float32, bfloat16");
  b->add_option("--device", a->device, "cpu or cuda[:N] (every rank on that device)");
  b->add_option("--seq", a->seq, "tokens per sequence");
  b->add_option("--batch-seqs", a->batch_seqs, "sequences per step (the whole group's batch)");
  b->add_option("--micro-batch-tokens", a->micro_batch_tokens, "tokens per micro-batch (accumulation above it)");
  b->add_option("--row-tokens", a->row_tokens, "packed row length: several sequences a row (0: --seq, one a row)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  b->add_option("--loss-tokens", a->loss_tokens, "the loss on each sequence's last N tokens only, as on RL completions (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  b->add_option("--group-size", a->group_size,
                 "sequences in groups of N sharing their untrained tokens, as one prompt's samples (with --loss-tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  b->add_option("--share-prefix", a->share_prefix, "pack a group's shared prompt once (learner.share_prefix)");
  b->add_option("--head-on-loss-tokens", a->head_on_loss_tokens,
                "the policy head at trained tokens only (LearnerOptions::head_on_loss_tokens; 0: at every token)");
  b->add_option("--steps", a->steps, "timed steps (after one warm-up step)");
  b->add_option("--ranks", a->ranks, "group sizes to run, e.g. 1,2")->delimiter(',');
  b->add_option("--threads", a->threads, "compute threads per rank (0: cores / ranks)");
  b->add_option("--lora-rank", a->lora_rank, "train only LoRA adapters of this rank on every projection (0: every weight)")
      ->check(CLI::Range(0, 4096));
  b->add_flag("--activation-checkpointing", a->checkpointing, "recompute each block in backward");
  b->add_option("--profile", a->profile_steps,
                "then N more steps under LibTorch's profiler: rank 0's operators by self time per step (stderr, JSON)")
      ->check(CLI::Range(0, 1000));
  b->add_option("--trace", a->trace_dir,
                "then one more step under the kernel trace: rank 0's kernels into DIR (kernels.csv; trace.json where LibTorch has Kineto)");
  b->add_flag("--as-rank", a->as_rank, "internal: run as one rank of the group")->group("");
  b->callback([a, b, &action] {
    std::vector<std::string> args{"bench", "learner"};
    for (const auto* opt : b->get_options()) {
      if (opt->get_name() == "--as-rank" || opt->get_name() == "--threads" || opt->get_name() == "--help" ||
          opt->count() == 0)
        continue;
      if (opt->get_expected_min() == 0) {  // a flag
        args.push_back(opt->get_name());
        continue;
      }
      for (const auto& v : opt->results()) {
        args.push_back(opt->get_name());
        args.push_back(v);
      }
    }
    action = [a, args] { return bench_learner(*a, args); };
  });

  auto* d = app.add_subcommand("dist", "Distributed groups on this machine");
  d->require_subcommand(1);
  auto nproc = std::make_shared<int>(2);
  auto cmd = std::make_shared<std::vector<std::string>>();
  auto timeout = std::make_shared<double>(24 * 3600);
  auto* run = d->add_subcommand("run", "Start N ranks of a command with RLX_RANK, RLX_WORLD_SIZE and RLX_STORE set; "
                                       "a failed rank stops the others; exit 0 only if every rank exits 0");
  run->add_option("--nproc", *nproc, "ranks")->check(CLI::Range(1, 1024));
  run->add_option("--timeout", *timeout, "seconds before every rank is killed");
  run->add_option("command", *cmd, "the command (after --)")->required();
  run->callback([nproc, cmd, timeout, &action] {
    action = [nproc, cmd, timeout] {
      dist::LocalGroup g({.world_size = *nproc, .argv = *cmd});
      const auto& exits = g.wait(*timeout);
      int rc = 0;
      for (size_t r = 0; r < exits.size(); ++r) {
        if (!exits[r].ok()) {
          std::cerr << fmt::format("rlx dist run: rank {} {}\n", r, exits[r].describe());
          rc = kExitFailure;
        }
      }
      return rc;
    };
  });
}

}  // namespace rlx::cli
