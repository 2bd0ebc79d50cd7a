// Gloo and NCCL (through c10d) and single-process communicators, the TCPStore rendezvous,
// and the heartbeats that make a failed collective attributable.
#include "rlx/dist/comm.hpp"

#include <fmt/ranges.h>

#if RLX_WITH_GLOO
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if RLX_WITH_NCCL
#define USE_C10D_NCCL 1
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/errors.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/core/fault.hpp"
#include "rlx/core/log.hpp"

namespace rlx::dist {

namespace {

using std::chrono::milliseconds;

#if RLX_WITH_GLOO || RLX_WITH_NCCL
c10::intrusive_ptr<c10d::TCPStore> store_client(const std::string& host, int port, int world, double timeout_s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.numWorkers = world;
  o.waitWorkers = false;
  o.timeout = to_ms(timeout_s);
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

// The group's view of the store: its keys under `prefix` (a group generation), if any.
c10::intrusive_ptr<c10d::Store> group_store(const RendezvousOptions& o, int port, double timeout_s) {
  c10::intrusive_ptr<c10d::Store> s = store_client(o.store_host, port, o.world_size, timeout_s);
  if (o.prefix.empty()) return s;
  return c10::make_intrusive<c10d::PrefixStore>(o.prefix, s);
}

// The store value of an add(key, 0): the counter without changing it.
int64_t read_counter(c10d::Store& store, const std::string& key) { return store.add(key, 0); }

std::string hb_key(int rank) { return fmt::format("rlx/heartbeat/{}", rank); }
std::string done_key(int rank) { return fmt::format("rlx/done/{}", rank); }
#endif

// -- single process ----------------------------------------------------------------

struct DoneWork final : Work {
  void wait() override {}
};

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  std::unique_ptr<Work> all_gather(const at::Tensor& out, const at::Tensor& in, std::string_view) override {
    RLX_CHECK(out.numel() == in.numel(), "all_gather: output has {} elements, expected {}", out.numel(), in.numel());
    if (!out.is_same(in)) out.copy_(in.view_as(out));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> reduce_scatter(const at::Tensor& out, const at::Tensor& in, std::string_view) override {
    RLX_CHECK(out.numel() == in.numel(), "reduce_scatter: output has {} elements, expected {}", out.numel(), in.numel());
    if (!out.is_same(in)) out.copy_(in.view_as(out));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> all_reduce(const at::Tensor&, ReduceOp, std::string_view) override {
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<Work> broadcast(const at::Tensor&, int root, std::string_view) override {
    RLX_CHECK(root == 0, "broadcast: root {} is not a rank of a 1-rank group", root);
    return std::make_unique<DoneWork>();
  }
  void barrier(std::string_view) override {}
};

// -- groups that meet through the store ------------------------------------------------
#if RLX_WITH_GLOO || RLX_WITH_NCCL

// What Gloo and NCCL groups share: joining through the store, heart-beating through it, and
// turning a failed or timed-out collective into a CommError that names the silent peers.
class StoreGroup : public Communicator {
 public:
  explicit StoreGroup(const RendezvousOptions& o) : opt_(o) {
    RLX_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "rendezvous: rank {} is not in [0, {})",
              o.rank, o.world_size);
    RLX_CHECK(o.timeout_s > 0 && o.connect_timeout_s > 0 && o.heartbeat_s > 0,
              "rendezvous: timeouts must be positive (timeout_s {}, connect_timeout_s {}, heartbeat_s {})", o.timeout_s,
              o.connect_timeout_s, o.heartbeat_s);
    joining([&] {
      if (o.host_store) {
        server_ = std::make_unique<StoreServer>(o.store_host, o.store_port);
        opt_.store_port = server_->port();
      }
      RLX_CHECK(opt_.store_port > 0 && opt_.store_port < 65536, "rendezvous: store port {} is not a port",
                opt_.store_port);
      store_ = group_store(opt_, opt_.store_port, o.connect_timeout_s);
      beat_store_ = group_store(opt_, opt_.store_port, std::min(o.timeout_s, 10.0));
    });
    beats_ = std::thread([this] { beat(); });
  }

  ~StoreGroup() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    beats_.join();
    try {
      beat_store_->set(done_key(opt_.rank), std::vector<uint8_t>{1});
    } catch (...) {
    }
  }

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.world_size; }

 protected:
  // Runs a step of joining the group; what it throws becomes a CommError naming the store.
  template <class F>
  void joining(F&& f) {
    try {
      f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(fmt::format("rank {}: joining the group of {} through the store at {}:{} failed: {}", opt_.rank,
                                  opt_.world_size, opt_.store_host, opt_.store_port, error_text(e)));
    }
  }

  struct StoreWork final : Work {
    StoreGroup* comm = nullptr;
    c10::intrusive_ptr<c10d::Work> work;
    std::string op, what;
    double started = 0;
    std::function<void()> then;
    void wait() override {
      try {
        work->wait(to_ms(comm->opt_.timeout_s));
      } catch (const std::exception& e) {
        throw CommError(comm->diagnose(op, what, now_s() - started, error_text(e)));
      }
      if (then) then();
    }
  };

  template <class Start>
  std::unique_ptr<StoreWork> run(const char* op, std::string_view what, Start&& start) {
    fault::crash_at(fault::Point::collective, {.rank = opt_.rank, .what = what});  // RLX_COMM_CRASH
    auto w = std::make_unique<StoreWork>();
    w->comm = this;
    w->op = op;
    w->what = what;
    w->started = now_s();
    try {
      w->work = start();
    } catch (const std::exception& e) {
      throw CommError(diagnose(op, what, 0, error_text(e)));
    }
    return w;
  }

  RendezvousOptions opt_;
  c10::intrusive_ptr<c10d::Store> store_;

 private:
  // Each rank adds 1 to its counter every heartbeat_s; a counter that stops
  // moving names a dead or stopped peer.
  void beat() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      try {
        beat_store_->add(hb_key(opt_.rank), 1);
      } catch (...) {
        // The store is gone; diagnose() reports that when a collective fails.
      }
      lock.lock();
      cv_.wait_for(lock, to_ms(opt_.heartbeat_s), [this] { return stop_; });
    }
  }

  std::string diagnose(std::string_view op, std::string_view what, double elapsed, const std::string& cause) {
    std::string msg = fmt::format("rank {}: {} {:?} failed after {:.1f} s ({})", opt_.rank, op, what, elapsed, cause);
    if (size() == 1) return msg;
    try {
      auto probe = group_store(opt_, opt_.store_port, 3.0);
      auto raw = store_client(opt_.store_host, opt_.store_port, opt_.world_size, 3.0);
      std::vector<int64_t> before(static_cast<size_t>(size()));
      for (int r = 0; r < size(); ++r) before[static_cast<size_t>(r)] = read_counter(*probe, hb_key(r));
      // A launcher that hosts the store says which rank's process ended (and how) as soon as it
      // sees it: no need to wait out the heartbeats then.
      std::vector<std::string> exited;
      const double window = 3 * opt_.heartbeat_s + 0.2, end = now_s() + window;
      while (exited.empty() && now_s() < end) {
        std::this_thread::sleep_for(milliseconds(50));
        for (int r = 0; r < size(); ++r) {
          if (r == opt_.rank || !raw->check({exit_key(r)})) continue;
          const auto how = raw->get(exit_key(r));
          exited.push_back(fmt::format("rank {} ended ({})", r, std::string(how.begin(), how.end())));
        }
      }
      if (!exited.empty()) return msg + "; " + fmt::format("{}", fmt::join(exited, "; "));
      std::vector<std::string> silent, finished;
      for (int r = 0; r < size(); ++r) {
        if (r == opt_.rank) continue;
        if (probe->check({done_key(r)})) {
          finished.push_back(std::to_string(r));
        } else if (read_counter(*probe, hb_key(r)) == before[static_cast<size_t>(r)]) {
          silent.push_back(std::to_string(r));
        }
      }
      if (!silent.empty())
        msg += fmt::format("; rank{} {} {} not responding (no heartbeat for {:.1f} s)", silent.size() > 1 ? "s" : "",
                           fmt::join(silent, ", "), silent.size() > 1 ? "are" : "is", window);
      if (!finished.empty())
        msg += fmt::format("; rank{} {} already left the group", finished.size() > 1 ? "s" : "",
                           fmt::join(finished, ", "));
      if (silent.empty() && finished.empty()) msg += "; every peer is still heart-beating (a peer is stuck or slow)";
    } catch (const std::exception& e) {
      msg += fmt::format("; the rendezvous store at {}:{} is unreachable ({})", opt_.store_host, opt_.store_port,
                         error_text(e));
    }
    return msg;
  }

  std::unique_ptr<StoreServer> server_;
  c10::intrusive_ptr<c10d::Store> beat_store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread beats_;
};

// The collectives that run alike on every c10d backend, over its process group PG.
// A backend says how a tensor travels (stage) and moves gathers and scatters itself.
template <class PG>
class C10dGroup : public StoreGroup {
 public:
  using StoreGroup::StoreGroup;

  std::unique_ptr<Work> all_reduce(const at::Tensor& t, ReduceOp op, std::string_view what) override {
    RLX_CHECK(t.is_contiguous(), "all_reduce {:?}: the tensor must be contiguous", what);
    auto staged = stage(t, /*reduces=*/true);
    std::vector<at::Tensor> ts{staged.tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = op == ReduceOp::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
    auto work = run("all_reduce", what, [&] { return pg_->allreduce(ts, o); });
    work->then = std::move(staged.back);
    return work;
  }

  std::unique_ptr<Work> broadcast(const at::Tensor& t, int root, std::string_view what) override {
    RLX_CHECK(root >= 0 && root < size() && t.is_contiguous(), "broadcast {:?}: root {} of {} ranks, contiguous tensor",
              what, root, size());
    auto staged = stage(t, /*reduces=*/false);
    std::vector<at::Tensor> ts{staged.tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    auto work = run("broadcast", what, [&] { return pg_->broadcast(ts, o); });
    work->then = std::move(staged.back);
    return work;
  }

 protected:
  // The tensor the process group works on for t, and what copies its result back into t
  // after the collective (empty: t itself, in place).
  struct Staged {
    at::Tensor tensor;
    std::function<void()> back;
  };
  virtual Staged stage(const at::Tensor& t, bool reduces) const = 0;

  void check_gather(const at::Tensor& out, const at::Tensor& in, std::string_view what) const {
    RLX_CHECK(out.numel() == in.numel() * size() && out.is_contiguous() && in.is_contiguous() &&
                  out.scalar_type() == in.scalar_type(),
              "all_gather {:?}: output must be contiguous with {} elements of {}", what, in.numel() * size(),
              c10::toString(in.scalar_type()));
  }
  void check_scatter(const at::Tensor& out, const at::Tensor& in, std::string_view what) const {
    RLX_CHECK(in.numel() == out.numel() * size() && in.is_contiguous() && out.is_contiguous() &&
                  out.scalar_type() == in.scalar_type(),
              "reduce_scatter {:?}: input must be contiguous with {} elements of {}", what, out.numel() * size(),
              c10::toString(out.scalar_type()));
  }

  c10::intrusive_ptr<PG> pg_;
};
#endif  // RLX_WITH_GLOO || RLX_WITH_NCCL

// -- Gloo --------------------------------------------------------------------------
#if RLX_WITH_GLOO

class Gloo final : public C10dGroup<c10d::ProcessGroupGloo> {
 public:
  explicit Gloo(const RendezvousOptions& o) : C10dGroup(o) {
    joining([&] {
      auto pg_opts = c10d::ProcessGroupGloo::Options::create(to_ms(o.timeout_s));
      pg_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.interface_host));
      pg_opts->threads = 2;
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, o.rank, o.world_size, pg_opts);
      store_->setTimeout(to_ms(o.timeout_s));
    });
  }

  std::string backend() const override { return "gloo"; }

  std::unique_ptr<Work> all_gather(const at::Tensor& out, const at::Tensor& in, std::string_view what) override {
    check_gather(out, in, what);
    const int64_t n = in.numel();
    std::vector<std::vector<at::Tensor>> outs(1);
    auto flat = wire(out.view({-1}));
    for (int r = 0; r < size(); ++r) outs[0].push_back(flat.narrow(0, r * n, n));
    std::vector<at::Tensor> ins{wire(in.view({-1}))};
    return run("all_gather", what, [&] { return pg_->allgather(outs, ins); });
  }

  std::unique_ptr<Work> reduce_scatter(const at::Tensor& out, const at::Tensor& in, std::string_view what) override {
    // Gloo in c10d has no reduce-scatter: an all-to-all moves chunk r of every rank to
    // rank r, which adds them in rank order.
    check_scatter(out, in, what);
    const int64_t n = out.numel();
    auto received = at::empty({size(), n}, in.options());
    auto send = wire(in.view({-1}));
    auto recv = wire(received.view({-1}));
    std::vector<int64_t> even;
    auto work = run("reduce_scatter", what, [&] { return pg_->alltoall_base(recv, send, even, even); });
    work->then = [received, out] {
      // Added in fp32 whatever the wire dtype, in rank order.
      auto acc = received[0].to(at::kFloat);
      for (int64_t r = 1; r < received.size(0); ++r) acc.add_(received[r].to(at::kFloat));
      out.view({-1}).copy_(acc);
    };
    return work;
  }

  void barrier(std::string_view what) override {
    // c10d's Gloo barrier is itself a collective with the group's timeout.
    run("barrier", what, [&] { return pg_->barrier(); })->wait();
  }

 private:
  // Gloo reduces no 16-bit floats: they travel as fp32 and are copied back. Copies need
  // none of its arithmetic, and Gloo (in LibTorch 1.13) moves no bf16: bf16 travels as
  // fp16 of the same bytes.
  Staged stage(const at::Tensor& t, bool reduces) const override {
    if (reduces && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf)) {
      auto wide = t.to(at::kFloat);
      return {wide, [t, wide] { t.copy_(wide); }};
    }
    return {wire(t), {}};
  }
  static at::Tensor wire(const at::Tensor& t) {
    if (t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);
    return t;
  }
};
#endif  // RLX_WITH_GLOO

// -- NCCL --------------------------------------------------------------------------
#if RLX_WITH_NCCL

// c10d's ProcessGroupNCCL: CUDA tensors in place; a CPU tensor (a batch's bytes, a
// broadcast value) goes through a device copy and back. Sums are NCCL's: the same on every
// run of one topology, but not added in rank order as Gloo's are. A timed-out collective
// aborts its communicators (the watchdog, with async error handling set to clean up
// without tearing the process down) and raises CommError in wait(); the group is not
// usable after that, and the run re-forms it by restarting its ranks.
class Nccl final : public C10dGroup<c10d::ProcessGroupNCCL> {
 public:
  explicit Nccl(const RendezvousOptions& o) : C10dGroup(o) {
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
    ::setenv("NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
    joining([&] {
      auto pg_opts = c10d::ProcessGroupNCCL::Options::create();
      pg_opts->timeout = to_ms(o.timeout_s);
      store_->setTimeout(to_ms(o.timeout_s));
      pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, o.rank, o.world_size, pg_opts);
    });
  }

  std::string backend() const override { return "nccl"; }

  std::unique_ptr<Work> all_gather(const at::Tensor& out, const at::Tensor& in, std::string_view what) override {
    check_gather(out, in, what);
    auto o = stage(out, false), i = stage(in, false);
    auto ov = o.tensor.view({-1}), iv = i.tensor.view({-1});
    auto work = run("all_gather", what, [&] { return pg_->_allgather_base(ov, iv); });
    work->then = std::move(o.back);
    return work;
  }

  std::unique_ptr<Work> reduce_scatter(const at::Tensor& out, const at::Tensor& in, std::string_view what) override {
    check_scatter(out, in, what);
    auto o = stage(out, true), i = stage(in, true);
    auto ov = o.tensor.view({-1}), iv = i.tensor.view({-1});
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    auto work = run("reduce_scatter", what, [&] { return pg_->_reduce_scatter_base(ov, iv, opts); });
    work->then = std::move(o.back);
    return work;
  }

  void barrier(std::string_view what) override {
    // An all-reduce of one element on this rank's device: NCCL's barrier guesses the device.
    auto one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
    all_reduce(one, ReduceOp::sum, what)->wait();
  }

 private:
  static at::Device device() { return {at::kCUDA, c10::cuda::current_device()}; }
  // A CUDA tensor itself; a CPU tensor's device copy, copied back after.
  Staged stage(const at::Tensor& t, bool) const override {
    if (t.is_cuda()) return {t, {}};
    auto staged = t.to(device());
    return {staged, [t, staged] { t.copy_(staged); }};
  }
};
#endif  // RLX_WITH_NCCL

}  // namespace

std::unique_ptr<Communicator> single_process() { return std::make_unique<SingleProcess>(); }

bool nccl_available() { return RLX_WITH_NCCL != 0; }

void use_device_for_collectives(const at::Device& device) {
#if RLX_WITH_NCCL
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

std::unique_ptr<Communicator> connect(const RendezvousOptions& options) {
  // A group of one needs no collectives (nor Gloo), whether or not a store was named.
  if (options.world_size == 1 && !options.host_store) return single_process();
  if (options.nccl) {
#if RLX_WITH_NCCL
    return std::make_unique<Nccl>(options);
#else
    throw CommError("this rlx was built without NCCL (RLX_NCCL, nccl.h and a LibTorch with CUDA): a group of CUDA "
                    "ranks is not available");
#endif
  }
#if RLX_WITH_GLOO
  return std::make_unique<Gloo>(options);
#else
  throw CommError("this rlx was built without Gloo (libgloo-dev): a group of several CPU ranks is not available");
#endif
}

// -- a group that re-forms ------------------------------------------------------------

namespace {

// Forwards to the current generation's group; a CommError from it marks the generation broken.
class Reformable final : public ReformableGroup {
 public:
  explicit Reformable(const RendezvousOptions& o) : base_(o) {
    RLX_CHECK(!o.host_store, "a re-formable group needs the launcher's store: rank {} would host it (RLX_STORE_HOST_SELF)",
              o.rank);
#if RLX_WITH_GLOO || RLX_WITH_NCCL
    if (o.world_size > 1) {
      RLX_CHECK(o.store_port > 0, "a re-formable group of {} ranks needs a store (RLX_STORE)", o.world_size);
      raw_ = store_client(o.store_host, o.store_port, o.world_size, o.connect_timeout_s);
      // A rank that starts while the group exists replaces a dead one: it joins the next generation.
      if (raw_->check({formed_key()})) {
        const auto v = raw_->get(formed_key());
        generation_ = std::stoll(std::string(v.begin(), v.end())) + 1;
      }
    }
#endif
    join();
  }

  int64_t generation() const override { return generation_; }
  bool broken() const override { return broken_; }
  void reform() override {
    group_.reset();  // its process group, heartbeats and connections go first
    ++generation_;
    join();
  }

  void finish() override {
#if RLX_WITH_GLOO || RLX_WITH_NCCL
    if (base_.world_size == 1 || base_.rank != 0) return;
    raw_->set(finished_key(), std::vector<uint8_t>{1});
#endif
  }
  bool finished() const override { return finished_; }

  int rank() const override { return base_.rank; }
  int size() const override { return base_.world_size; }
  std::string backend() const override { return group_ ? group_->backend() : "none"; }

  std::unique_ptr<Work> all_gather(const at::Tensor& out, const at::Tensor& in, std::string_view what) override {
    return guard([&] { return group().all_gather(out, in, what); });
  }
  std::unique_ptr<Work> reduce_scatter(const at::Tensor& out, const at::Tensor& in, std::string_view what) override {
    return guard([&] { return group().reduce_scatter(out, in, what); });
  }
  std::unique_ptr<Work> all_reduce(const at::Tensor& t, ReduceOp op, std::string_view what) override {
    return guard([&] { return group().all_reduce(t, op, what); });
  }
  std::unique_ptr<Work> broadcast(const at::Tensor& t, int root, std::string_view what) override {
    return guard([&] { return group().broadcast(t, root, what); });
  }
  void barrier(std::string_view what) override {
    guard([&] {
      group().barrier(what);
      return std::unique_ptr<Work>();
    });
  }

 private:
  struct GuardedWork final : Work {
    std::unique_ptr<Work> inner;
    Reformable* owner = nullptr;
    void wait() override {
      try {
        inner->wait();
      } catch (const CommError&) {
        owner->broken_ = true;
        throw;
      }
    }
  };
  template <class F>
  std::unique_ptr<Work> guard(F&& f) {
    std::unique_ptr<Work> w;
    try {
      w = f();
    } catch (const CommError&) {
      broken_ = true;
      throw;
    }
    if (!w) return w;
    auto g = std::make_unique<GuardedWork>();
    g->inner = std::move(w);
    g->owner = this;
    return g;
  }
  Communicator& group() {
    if (!group_) throw CommError(fmt::format("rank {}: the group of generation {} did not form", base_.rank, generation_));
    return *group_;
  }
  std::string formed_key() const { return base_.prefix + "rlx/formed_generation"; }
  std::string finished_key() const { return base_.prefix + "rlx/finished"; }

  void join() {
    broken_ = false;
    auto o = base_;
    o.prefix = base_.prefix + fmt::format("gen/{}/", generation_);
    // After a death, a survivor notices it at its next collective at the latest.
    if (generation_ > 0) o.connect_timeout_s = std::max(o.connect_timeout_s, o.timeout_s + 30);
    if (o.world_size == 1) {
      group_ = single_process();
      return;
    }
#if RLX_WITH_GLOO || RLX_WITH_NCCL
    // Every rank arrives first (in slices, so that a group that finished meanwhile is seen),
    // then the process group forms at once.
    {
      const auto arrived = o.prefix + "rlx/arrived";
      raw_->add(arrived, 1);
      const double deadline = now_s() + o.connect_timeout_s;
      for (int64_t n = 0; (n = read_counter(*raw_, arrived)) < o.world_size;) {
        if (raw_->check({finished_key()})) {
          finished_ = true;
          return;
        }
        if (now_s() > deadline)
          throw CommError(fmt::format("rank {}: generation {} of the group did not form within {:.0f} s: {} of {} ranks "
                                      "arrived", base_.rank, generation_, o.connect_timeout_s, n, o.world_size));
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
#endif
    try {
      group_ = connect(o);
    } catch (const CommError& e) {
      throw CommError(fmt::format("{} (generation {})", e.what(), generation_));
    }
#if RLX_WITH_GLOO || RLX_WITH_NCCL
    // How this rank's predecessor ended is history now (every peer diagnosed it before joining).
    raw_->deleteKey(exit_key(base_.rank));
    if (base_.rank == 0) {
      const auto v = std::to_string(generation_);
      raw_->set(formed_key(), std::vector<uint8_t>(v.begin(), v.end()));
    }
#endif
  }

  RendezvousOptions base_;
  int64_t generation_ = 0;
  bool broken_ = false, finished_ = false;
  std::unique_ptr<Communicator> group_;
#if RLX_WITH_GLOO || RLX_WITH_NCCL
  c10::intrusive_ptr<c10d::Store> raw_;  // the store without a generation's prefix (several ranks: set)
#endif
};

}  // namespace

std::unique_ptr<ReformableGroup> connect_reformable(const RendezvousOptions& options) {
  return std::make_unique<Reformable>(options);
}

}  // namespace rlx::dist
