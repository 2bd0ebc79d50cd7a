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

#include "cli/bench_broadcast.hpp"
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

struct BenchArgs {
  std::string preset = "small", arch = "qwen2", dtype = "float32", device = "cpu";
  int64_t seq = 256, batch_seqs = 8, micro_batch_tokens = 2048, steps = 3;
  std::vector<int> ranks{1, 2};
  int threads = 0;
  int64_t profile_steps = 0;  // steps after the timed ones under LibTorch's profiler
  bool checkpointing = false, as_rank = false;
};

// Measured GEMM throughput, the "peak" MFU is relative to: fp32 on this process's threads,
// or on a CUDA device a large product in the compute dtype.
double gemm_gflops(at::Device device, at::ScalarType dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto o = at::TensorOptions().device(device).dtype(device.is_cuda() ? dtype : at::kFloat);
  auto a = at::randn({n, n}, o), b = at::randn({n, n}, o);
  auto sync = [&] { (void)at::mm(a.narrow(0, 0, 1), b.narrow(1, 0, 1)).cpu(); };
  at::mm(a, b);
  sync();
  const double t0 = now_s();
  int k = 0;
  while (now_s() - t0 < 1.0 || k < 3) {
    at::mm(a, b);
    if (device.is_cuda()) sync();
    ++k;
  }
  return 2.0 * static_cast<double>(n * n * n) * k / (now_s() - t0) / 1e9;
}

// Training FLOPs per token (forward + backward = 3x forward): 6 per matmul weight,
// plus attention scores and values (12 * layers * heads * head_dim * context).
double train_flops_per_token(const ModelConfig& c, double context) {
  const double d = static_cast<double>(c.hidden_size), q = static_cast<double>(c.num_heads * c.head_dim),
               kv = static_cast<double>(c.num_kv_heads * c.head_dim), f = static_cast<double>(c.intermediate_size);
  const double per_layer = d * q * 2 + d * kv * 2 + 3 * d * f;
  const double matmul = static_cast<double>(c.num_layers) * per_layer + d * static_cast<double>(c.vocab_size);
  return 6 * matmul + 12 * static_cast<double>(c.num_layers) * q * context;
}

int64_t parameter_count(const ModelConfig& cfg) {
  int64_t n = 0;
  for (auto& [name, p] : Transformer(cfg).hf_parameters()) n += p.numel();
  return n;
}

json bench_rank(const BenchArgs& a) {
  auto comm = dist::connect(dist::rendezvous_from_env());
  const auto plan = set_compute_threads(a.threads);
  const auto cfg = model_preset(a.preset, *config::enum_from_string<Arch>(a.arch));
  LearnerOptions o;
  o.packing.row_tokens = a.seq;
  o.packing.micro_batch_tokens = std::max(a.micro_batch_tokens, a.seq);
  o.fsdp.activation_checkpointing = a.checkpointing;
  o.fsdp.compute_dtype = to_scalar_type(*config::enum_from_string<DType>(a.dtype));
  o.fsdp.device = at::Device(a.device);
  Learner learner(cfg, *comm, o);
  learner.init_weights(0);
  auto peak = at::tensor({gemm_gflops(o.fsdp.device, o.fsdp.compute_dtype)}, at::kDouble);
  comm->all_reduce(peak, dist::ReduceOp::sum, "bench: gemm peak")->wait();
  RngStream rng(1, 0);
  std::vector<double> times;
  int64_t tokens = 0;
  cli::OpProfile profiler;
  for (int64_t s = 0; s <= a.steps + a.profile_steps; ++s) {  // step 0 is a warm-up
    if (s == a.steps + 1) profiler.start();
    std::vector<Sequence> mine;
    for (int64_t i = 0; i < a.batch_seqs; ++i) {
      Sequence q;
      for (int64_t t = 0; t < a.seq; ++t) {
        q.tokens.push_back(rng.uniform_int(0, cfg.vocab_size - 1));
        q.loss_mask.push_back(1);
      }
      if (i % comm->size() == comm->rank()) mine.push_back(std::move(q));
    }
    auto r = learner.step(mine, [](const MicroBatch& mb, const TokenOutputs& out, const StepContext& ctx, Metrics&) {
      return -(out.logprobs * mb.loss_mask).sum() / ctx.global_loss_tokens;
    });
    if (s > 0 && s <= a.steps) {
      times.push_back(r.seconds);
      tokens = a.batch_seqs * a.seq;
    }
  }
  json profile = nullptr;
  if (a.profile_steps > 0) {
    const auto ops = profiler.stop();
    profile = cli::OpProfile::to_json(ops, 40, static_cast<double>(a.profile_steps));
  }
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];
  auto rss = at::tensor({peak_rss_mb()}, at::kDouble);
  comm->all_reduce(rss, dist::ReduceOp::max, "bench: peak memory")->wait();
  const double device_peak_mb = static_cast<double>(compat::device_peak_bytes(o.fsdp.device)) / (1 << 20);
  const double flops = train_flops_per_token(cfg, static_cast<double>(a.seq) / 2) * static_cast<double>(tokens);
  const double achieved = flops / step_s / 1e9;
  return {{"ranks", comm->size()},
          {"threads_per_rank", plan.threads()},
          {"tokens_per_step", tokens},
          {"step_s", step_s},
          {"step_s_min", times.front()},
          {"tokens_per_s", static_cast<double>(tokens) / step_s},
          {"peak_rss_mb", rss.item<double>()},
          {"model_gflops_per_step", flops / 1e9},
          {"achieved_gflops", achieved},
          {"gemm_peak_gflops", peak.item<double>()},
          {"mfu", achieved / peak.item<double>()},
          {"device_peak_mb", device_peak_mb >= 0 ? json(device_peak_mb) : json(nullptr)},
          {"profile", profile}};
}

int bench_learner(const BenchArgs& a, const std::vector<std::string>& self_args) {
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
            {"micro_batch_tokens", a.micro_batch_tokens},
            {"activation_checkpointing", a.checkpointing},
            {"parameters", parameter_count(cfg)},
            {"runs", runs}};
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

// `rlx bench sync`: the shared-memory weight-sync path against its raw ceiling (memcpy
// between two pre-faulted buffers of the same size), measured in the same run.
struct SyncBenchArgs {
  double mb = 512;
  int64_t tensors = 64;
  int64_t versions = 10;
  std::string dtype = "bfloat16";
  double changed = 0.125;  // delta mode: the fraction of tensors that change per version
  std::string path = "shm";  // shm, tcp, cuda-ipc or broadcast
  int64_t bucket_mb = 256;   // broadcast: bytes per collective
};

namespace {
// The tcp path's ceiling: raw ZeroMQ PUSH -> PULL over tcp://127.0.0.1 moving the same
// tensors as one zero-copy multipart message per version, in frames of at most 1 MiB as
// the path sends them (larger frames are slower: malloc maps and faults each one afresh).
// Seconds per version.
std::vector<double> raw_zmq_tcp(const std::vector<std::pair<std::string, at::Tensor>>& w, int64_t versions) {
  zmq::context_t send_ctx(1), recv_ctx(1);  // an I/O thread each, as publisher and subscriber have
  zmq::socket_t push(send_ctx, zmq::socket_type::push), pull(recv_ctx, zmq::socket_type::pull);
  push.set(zmq::sockopt::linger, 0);
  pull.bind("tcp://127.0.0.1:0");
  push.connect(pull.get(zmq::sockopt::last_endpoint));
  std::vector<double> out;
  size_t frames = 0;
  for (const auto& [n, t] : w) frames += std::max<size_t>(1, (static_cast<size_t>(t.nbytes()) + (1 << 20) - 1) >> 20);
  std::atomic<int64_t> received{0};
  std::thread receiver([&] {  // as the subscriber: its own thread takes the frames
    for (int64_t v = 0; v <= versions; ++v) {
      for (size_t f = 0; f < frames; ++f) {
        zmq::message_t m;
        RLX_CHECK(pull.recv(m), "bench sync: raw tcp lost frames");
      }
      received = v + 1;
    }
  });
  for (int64_t v = 0; v <= versions; ++v) {  // the first is a warm-up
    const double t0 = now_s();
    for (size_t i = 0; i < w.size(); ++i) {
      auto* p = static_cast<char*>(w[i].second.data_ptr());
      const auto n = static_cast<size_t>(w[i].second.nbytes());
      size_t at = 0;
      do {
        const auto len = std::min(size_t{1} << 20, n - at);
        zmq::message_t m(p + at, len, [](void*, void*) {}, nullptr);
        push.send(m, zmq::send_flags::none);
        at += len;
      } while (at < n);
    }
    while (received.load() < v + 1) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (v > 0) out.push_back(now_s() - t0);
  }
  receiver.join();
  return out;
}

// The tcp path: publish, then poll until the subscriber holds the version. Seconds per
// version (publish and delivery), and the bytes that travelled.
std::pair<std::vector<double>, std::vector<double>> tcp_versions(std::vector<std::pair<std::string, at::Tensor>>& w,
                                                                  const dist::WeightLayout& layout, bool delta,
                                                                  const SyncBenchArgs& a, int64_t& moved) {
  dist::TcpWeightPublisher pub({.bind = "tcp://127.0.0.1:0", .advertise_host = "127.0.0.1", .delta = delta, .full_every = 1000},
                               layout);
  pub.publish(1, w);
  dist::TcpWeightSubscriber sub({.endpoint = pub.endpoint()});
  RLX_CHECK(sub.poll(), "bench sync: the tcp subscriber did not get version 1");
  std::vector<double> pub_s, total_s;
  // Versions 2 and 3 are a warm-up: the publisher's second snapshot and the subscriber's
  // second buffer are touched for the first time.
  const int64_t warm = 2;
  for (int64_t v = 2; v < 2 + warm + a.versions; ++v) {
    const auto n_changed = delta ? std::max<int64_t>(1, static_cast<int64_t>(a.changed * a.tensors)) : a.tensors;
    for (int64_t i = 0; i < n_changed; ++i) w[static_cast<size_t>((v + i) % a.tensors)].second.fill_(static_cast<double>(v));
    const double t0 = now_s();
    pub.publish(v, w);
    pub_s.push_back(now_s() - t0);
    std::optional<dist::WeightUpdate> u;
    while (!(u = sub.poll()) && now_s() - t0 < 120) std::this_thread::sleep_for(std::chrono::microseconds(200));
    total_s.push_back(now_s() - t0);
    RLX_CHECK(u && u->version == v, "bench sync: the tcp subscriber did not get version {}", v);
    if (v < 2 + warm) {
      pub_s.pop_back(), total_s.pop_back();
      continue;
    }
    moved += u->bytes_copied;
  }
  return {pub_s, total_s};
}

// The CUDA IPC path (a CUDA build on a GPU): a subscriber process forked before this one
// touches CUDA (CUDA opens an IPC handle only in another process) polls for each version
// and reports when it has it; the publisher here times publish() until that report. The
// ceiling is a device-to-device copy of the same bytes. Versions are filled with their
// number, which the subscriber checks. Returns the JSON line's fields.
json cuda_ipc_versions(int64_t tensors, int64_t per, at::ScalarType dtype, int64_t versions) {
  RLX_CHECK(RLX_WITH_CUDA, "bench sync --path cuda-ipc needs a build of rlx with CUDA (RLX_CUDA)");
  const std::string name = fmt::format("rlx-bench-sync-cuda-{}", ::getpid());
  int fds[2];
  RLX_CHECK(::pipe(fds) == 0, "bench sync: pipe: {}", std::strerror(errno));
  const pid_t child = ::fork();
  RLX_CHECK(child >= 0, "bench sync: fork: {}", std::strerror(errno));
  if (child == 0) {  // the subscriber: each version's number and arrival time, then whether it was right
    ::close(fds[0]);
    int rc = 0;
    try {
      dist::ShmWeightSubscriber sub({.name = name, .attach_timeout_s = 60});
      for (int64_t v = 1; v <= versions + 1;) {
        auto u = sub.poll();
        if (!u) continue;
        const double at = now_s();
        const bool right = u->version == v && u->tensors.back().second.flatten()[per - 1].item<double>() == static_cast<double>(v);
        const double report[3] = {static_cast<double>(u->version), at, right ? 1.0 : 0.0};
        if (::write(fds[1], report, sizeof report) != static_cast<ssize_t>(sizeof report)) break;
        if (!right) rc = 1;
        v = u->version + 1;
      }
    } catch (const std::exception& e) {
      std::cerr << "bench sync: subscriber: " << e.what() << "\n";
      rc = 1;
    }
    ::_exit(rc);
  }
  ::close(fds[1]);
  struct Reap {  // the subscriber does not outlive a failure here
    pid_t pid;
    bool done = false;
    ~Reap() {
      if (done) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  const at::Device dev(at::kCUDA, 0);
  std::vector<std::pair<std::string, at::Tensor>> w;
  for (int64_t i = 0; i < tensors; ++i) w.emplace_back(fmt::format("t{}", i), at::zeros({per}, at::TensorOptions().dtype(dtype).device(dev)));
  const auto layout = dist::WeightLayout::of(w, dtype);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> pub_s, total_s, copy_s;
  bool all_right = true;
  {
    dist::ShmWeightPublisher pub({.name = name, .device = "cuda:0"}, layout);
    for (int64_t v = 1; v <= versions + 1; ++v) {
      for (auto& [n, t] : w) t.fill_(static_cast<double>(v));
      torch::cuda::synchronize();
      const double t0 = now_s();
      pub.publish(v, w);
      const double t1 = now_s();
      double report[3] = {0, 0, 0};
      while (report[0] < static_cast<double>(v))
        RLX_CHECK(::read(fds[0], report, sizeof report) == static_cast<ssize_t>(sizeof report),
                  "bench sync: the CUDA IPC subscriber stopped before version {}", v);
      all_right &= report[2] == 1.0;
      if (v == 1) continue;  // the first version maps the handles
      pub_s.push_back(t1 - t0);
      total_s.push_back(report[1] - t0);
    }
    // The ceiling: one device-to-device copy of a version's bytes.
    auto src = at::empty({layout.bytes()}, at::TensorOptions().dtype(at::kByte).device(dev)), dst = at::empty_like(src);
    for (int64_t i = 0; i <= versions; ++i) {
      torch::cuda::synchronize();
      const double t0 = now_s();
      dst.copy_(src);
      torch::cuda::synchronize();
      if (i > 0) copy_s.push_back(now_s() - t0);
    }
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  reap.done = true;
  RLX_CHECK(all_right && WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "bench sync: the CUDA IPC subscriber got a wrong version or failed (exit status {})", status);
  const double bytes = static_cast<double>(layout.bytes());
  const double ceiling = bytes / median(copy_s) / 1e9, gbps = bytes / median(total_s) / 1e9;
  return {{"bytes_per_version", bytes},
          {"d2d_copy_gbps", ceiling},
          {"publish_ms", median(pub_s) * 1e3},
          {"ms_per_version", median(total_s) * 1e3},
          {"gbps", gbps},
          {"full_vs_ceiling", gbps / ceiling}};
}
}  // namespace

int bench_sync(const SyncBenchArgs& a) {
  RLX_CHECK(a.mb > 0 && a.mb <= 65536 && a.tensors >= 1 && a.tensors <= 4096 && a.versions >= 2,
            "bench sync: --mb in (0, 65536], --tensors in [1, 4096], --versions >= 2");
  RLX_CHECK(a.path == "shm" || a.path == "tcp" || a.path == "cuda-ipc" || a.path == "broadcast",
            "bench sync: --path {:?} is not shm, tcp, cuda-ipc or broadcast", a.path);
  bus::keep_frame_memory();  // as the roles do: frames from malloc's heap, not a fresh mmap each
  const auto dtype = to_scalar_type(config::parse_enum<DType>(a.dtype, "bench sync --dtype"));
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(a.mb * 1e6) / a.tensors /
                                               static_cast<int64_t>(c10::elementSize(dtype)));
  if (a.path == "cuda-ipc") {  // before any tensor: the subscriber is forked first
    json j = {{"bench", "sync"}, {"path", "cuda-ipc"}, {"tensors", a.tensors}, {"dtype", a.dtype}};
    j.update(cuda_ipc_versions(a.tensors, per, dtype, a.versions));
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::vector<std::pair<std::string, at::Tensor>> w;
  for (int64_t i = 0; i < a.tensors; ++i) w.emplace_back(fmt::format("t{}", i), at::zeros({per}, dtype));
  const auto layout = dist::WeightLayout::of(w, dtype);
  const double bytes = static_cast<double>(layout.bytes());
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The ceiling: memcpy of the same bytes between two buffers already touched.
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 2);
  std::vector<double> copy_s;
  for (int64_t i = 0; i < a.versions; ++i) {
    const double t0 = now_s();
    std::memcpy(dst.data(), src.data(), src.size());
    copy_s.push_back(now_s() - t0);
  }
  json runs = json::array();
  if (a.path == "broadcast") {
    json j = {{"bench", "sync"}, {"path", "broadcast"}, {"bytes_per_version", bytes}, {"tensors", a.tensors},
              {"dtype", a.dtype}, {"versions", a.versions}, {"memcpy_gbps", bytes / median(copy_s) / 1e9}};
    j.update(cli::broadcast_versions(w, layout, a.versions, /*subscribers=*/2, a.bucket_mb));
    std::cout << fmt::format("broadcast to 2 subscribers (Gloo): {:.1f} ms per version, the raw broadcast {:.1f} ms "
                             "({:.2f}x)\n",
                             j["ms_per_version"].get<double>(), j["raw_broadcast_ms"].get<double>(),
                             j["vs_raw_broadcast"].get<double>());
    std::cout << j.dump() << std::endl;
    return 0;
  }
  if (a.path == "tcp") {
    const double ceiling = bytes / median(raw_zmq_tcp(w, a.versions)) / 1e9;
    for (const bool delta : {false, true}) {
      int64_t moved = 0;
      const auto [pub_s, total_s] = tcp_versions(w, layout, delta, a, moved);
      runs.push_back({{"mode", delta ? "delta" : "full"},
                      {"changed_fraction", delta ? a.changed : 1.0},
                      {"publish_ms", median(pub_s) * 1e3},
                      {"ms_per_version", median(total_s) * 1e3},
                      {"bytes_sent_per_version", static_cast<double>(moved) / static_cast<double>(a.versions)},
                      {"gbps", bytes / median(total_s) / 1e9}});
    }
    json j = {{"bench", "sync"},
              {"path", "tcp"},
              {"bytes_per_version", bytes},
              {"tensors", a.tensors},
              {"dtype", a.dtype},
              {"raw_zmq_tcp_gbps", ceiling},
              {"full_vs_ceiling", runs[0]["gbps"].get<double>() / ceiling},
              {"runs", runs}};
    std::cout << j.dump() << std::endl;
    return 0;
  }
  for (const bool delta : {false, true}) {
    const std::string name = fmt::format("rlx-bench-sync-{}", ::getpid());
    dist::ShmWeightPublisher pub({.name = name, .delta = delta, .full_every = 1000}, layout);
    pub.publish(1, w);
    dist::ShmWeightSubscriber sub({.name = name});
    sub.poll();
    std::vector<double> pub_s, sub_s;
    int64_t moved = 0;
    for (int64_t v = 2; v < 2 + a.versions; ++v) {
      const auto n_changed = delta ? std::max<int64_t>(1, static_cast<int64_t>(a.changed * a.tensors)) : a.tensors;
      for (int64_t i = 0; i < n_changed; ++i) w[static_cast<size_t>((v + i) % a.tensors)].second.fill_(static_cast<double>(v));
      double t0 = now_s();
      moved += pub.publish(v, w);
      pub_s.push_back(now_s() - t0);
      t0 = now_s();
      auto u = sub.poll();
      sub_s.push_back(now_s() - t0);
      RLX_CHECK(u && u->version == v, "bench sync: the subscriber did not get version {}", v);
    }
    runs.push_back({{"mode", delta ? "delta" : "full"},
                    {"changed_fraction", delta ? a.changed : 1.0},
                    {"publish_ms", median(pub_s) * 1e3},
                    {"subscribe_ms", median(sub_s) * 1e3},
                    {"ms_per_version", (median(pub_s) + median(sub_s)) * 1e3},
                    {"bytes_written_per_version", static_cast<double>(moved) / static_cast<double>(a.versions)},
                    {"publish_gbps", bytes / median(pub_s) / 1e9},
                    {"subscribe_gbps", bytes / median(sub_s) / 1e9}});
  }
  const double ceiling = bytes / median(copy_s) / 1e9;
  json j = {{"bench", "sync"},
            {"path", "shm"},
            {"bytes_per_version", bytes},
            {"tensors", a.tensors},
            {"dtype", a.dtype},
            {"memcpy_gbps", ceiling},
            {"publish_vs_ceiling", runs[0]["publish_gbps"].get<double>() / ceiling},
            {"subscribe_vs_ceiling", runs[0]["subscribe_gbps"].get<double>() / ceiling},
            {"runs", runs}};
  std::cout << j.dump() << std::endl;
  return 0;
}

void add_learner_commands(CLI::App& app, Action& action) {
  auto* inspect = app.get_subcommand("inspect");
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto* ck = inspect->add_subcommand("checkpoint", "Verify a checkpoint (or every one under a directory) and show what it holds");
  ck->add_option("dir", *dir, "a step_N checkpoint directory, or the directory holding them")->required();
  ck->add_flag("--json", *as_json, "one JSON line");
  ck->callback([dir, as_json, &action] { action = [dir, as_json] { return inspect_checkpoint(*dir, *as_json); }; });

  auto a = std::make_shared<BenchArgs>();
  auto* b = app.get_subcommand("bench")->add_subcommand(
      "learner", "Training steps of the sharded learner (1 and N local ranks): tokens/s, step time, peak memory, MFU");
  b->add_option("--preset", a->preset, "model preset");
  b->add_option("--arch", a->arch, "llama or qwen2");
  b->add_option("--dtype", a->dtype, "compute dtype: float32, bfloat16");
  b->add_option("--device", a->device, "cpu or cuda[:N] (every rank on that device)");
  b->add_option("--seq", a->seq, "tokens per sequence");
  b->add_option("--batch-seqs", a->batch_seqs, "sequences per step (the whole group's batch)");
  b->add_option("--micro-batch-tokens", a->micro_batch_tokens, "tokens per micro-batch (accumulation above it)");
  b->add_option("--steps", a->steps, "timed steps (after one warm-up step)");
  b->add_option("--ranks", a->ranks, "group sizes to run, e.g. 1,2")->delimiter(',');
  b->add_option("--threads", a->threads, "compute threads per rank (0: cores / ranks)");
  b->add_flag("--activation-checkpointing", a->checkpointing, "recompute each block in backward");
  b->add_option("--profile", a->profile_steps,
                "then N more steps under LibTorch's profiler: rank 0's operators by self time per step (stderr, JSON)")
      ->check(CLI::Range(0, 1000));
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

  auto sa = std::make_shared<SyncBenchArgs>();
  auto* bs = app.get_subcommand("bench")->add_subcommand(
      "sync", "Weight sync (shared memory, tcp, CUDA IPC or broadcast): GB/s and ms per version, full and delta, against the path's ceiling");
  bs->add_option("--mb", sa->mb, "megabytes per version");
  bs->add_option("--tensors", sa->tensors, "tensors per version");
  bs->add_option("--versions", sa->versions, "timed versions per mode");
  bs->add_option("--dtype", sa->dtype, "float32 or bfloat16");
  bs->add_option("--changed", sa->changed, "delta mode: the fraction of tensors changed per version");
  bs->add_option("--path", sa->path,
                 "shm (memcpy ceiling), tcp (loopback; raw ZeroMQ ceiling), cuda-ipc (a CUDA build; device copy "
                 "ceiling) or broadcast (2 subscribers over Gloo; raw broadcast ceiling)");
  bs->add_option("--bucket-mb", sa->bucket_mb, "broadcast: megabytes per collective");
  bs->callback([sa, &action] { action = [sa] { return bench_sync(*sa); }; });

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
