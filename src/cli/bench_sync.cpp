// rlx bench sync --path shm|tcp|cuda-ipc|broadcast|nccl   each weight-sync path against its
//                                                       ceiling, measured in the same run
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
#include "rlx/core/torch_compat.hpp"
#include "rlx/model/transformer.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/weight_sync.hpp"

namespace rlx::cli {

using nlohmann::json;

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

// The arguments' bounds, and what the path needs of this build and machine.
void check_sync_args(const SyncBenchArgs& a) {
  RLX_CHECK(a.mb > 0 && a.mb <= 65536 && a.tensors >= 1 && a.tensors <= 4096 && a.versions >= 2,
            "bench sync: --mb in (0, 65536], --tensors in [1, 4096], --versions >= 2");
  RLX_CHECK(a.path == "shm" || a.path == "tcp" || a.path == "cuda-ipc" || a.path == "broadcast" || a.path == "nccl",
            "bench sync: --path {:?} is not shm, tcp, cuda-ipc, broadcast or nccl", a.path);
  if (a.path == "nccl") {
    RLX_CHECK(dist::nccl_available(), "bench sync --path nccl needs a build of rlx with NCCL (RLX_CUDA, RLX_NCCL)");
    // NCCL refuses two ranks of a group on one device (the leases so far had one GPU).
    const auto devices = static_cast<int>(torch::cuda::device_count());
    RLX_CHECK(devices >= 2,
              "bench sync --path nccl needs 2 CUDA devices: the publisher on cuda:0 and a subscriber on each other "
              "one (NCCL refuses two ranks on one device); this machine has {}",
              devices);
  }
}

// The host paths' ceiling: memcpy of `bytes` between two buffers already touched, GB/s.
double memcpy_gbps(size_t bytes, int64_t versions) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  std::vector<double> copy_s;
  for (int64_t i = 0; i < versions; ++i) {
    const double t0 = now_s();
    std::memcpy(dst.data(), src.data(), src.size());
    copy_s.push_back(now_s() - t0);
  }
  return static_cast<double>(bytes) / median(copy_s) / 1e9;
}

// The shared-memory path, full versions and deltas (a.changed of the tensors): publish, then
// the subscriber's poll, each timed.
json shm_runs(std::vector<std::pair<std::string, at::Tensor>>& w, const dist::WeightLayout& layout,
              const SyncBenchArgs& a) {
  const double bytes = static_cast<double>(layout.bytes());
  json runs = json::array();
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
      for (int64_t i = 0; i < n_changed; ++i)
        w[static_cast<size_t>((v + i) % a.tensors)].second.fill_(static_cast<double>(v));
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
  return runs;
}
}  // namespace

int bench_sync(const SyncBenchArgs& a) {
  check_sync_args(a);
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
  const auto where = at::TensorOptions().dtype(dtype).device(a.path == "nccl" ? at::Device("cuda:0") : at::kCPU);
  for (int64_t i = 0; i < a.tensors; ++i) w.emplace_back(fmt::format("t{}", i), at::zeros({per}, where));
  const auto layout = dist::WeightLayout::of(w, dtype);
  const double bytes = static_cast<double>(layout.bytes());
  if (a.path == "broadcast" || a.path == "nccl") {
    const bool nccl = a.path == "nccl";
    // Two subscribers; with NCCL one a device past the publisher's, as many as there are.
    const int subscribers = nccl ? std::min(2, static_cast<int>(torch::cuda::device_count()) - 1) : 2;
    json j = {{"bench", "sync"},      {"path", a.path},   {"bytes_per_version", bytes},
              {"tensors", a.tensors}, {"dtype", a.dtype}, {"versions", a.versions}};
    if (!nccl) j["memcpy_gbps"] = memcpy_gbps(layout.bytes(), a.versions);
    j.update(cli::broadcast_versions(w, layout, a.versions, subscribers, a.bucket_mb, nccl));
    std::cout << fmt::format(
        "broadcast to {} subscribers ({}): {:.1f} ms per version, the raw broadcast {:.1f} ms "
        "({:.2f}x)\n",
        subscribers, nccl ? "NCCL" : "Gloo", j["ms_per_version"].get<double>(), j["raw_broadcast_ms"].get<double>(),
        j["vs_raw_broadcast"].get<double>());
    std::cout << j.dump() << std::endl;
    return 0;
  }
  if (a.path == "tcp") {
    const double ceiling = bytes / median(raw_zmq_tcp(w, a.versions)) / 1e9;
    json runs = json::array();
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
  const double ceiling = memcpy_gbps(layout.bytes(), a.versions);
  const json runs = shm_runs(w, layout, a);
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

void add_sync_bench(CLI::App& app, Action& action) {
  auto sa = std::make_shared<SyncBenchArgs>();
  auto* bs = app.get_subcommand("bench")->add_subcommand(
      "sync",
      "Weight sync (shared memory, tcp, CUDA IPC, broadcast over Gloo or NCCL): GB/s and ms per version, full and "
      "delta, against the path's ceiling");
  bs->add_option("--mb", sa->mb, "megabytes per version");
  bs->add_option("--tensors", sa->tensors, "tensors per version");
  bs->add_option("--versions", sa->versions, "timed versions per mode");
  bs->add_option("--dtype", sa->dtype, "float32 or bfloat16");
  bs->add_option("--changed", sa->changed, "delta mode: the fraction of tensors changed per version");
  bs->add_option("--path", sa->path,
                 "shm (memcpy ceiling), tcp (loopback; raw ZeroMQ ceiling), cuda-ipc (a CUDA build; device copy "
                 "ceiling), broadcast (2 subscribers over Gloo; raw broadcast ceiling) or nccl (the same over NCCL, "
                 "a device each: 2 GPUs or more)");
  bs->add_option("--bucket-mb", sa->bucket_mb, "broadcast: megabytes per collective");
  bs->callback([sa, &action] { action = [sa] { return bench_sync(*sa); }; });
}

}  // namespace rlx::cli
