#include "cli/bench_broadcast.hpp"

#include "cli/commands.hpp"

#include <algorithm>
#include <memory>
#include <thread>

#include "rlx/core/clock.hpp"
#include "rlx/core/error.hpp"
#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_broadcast.hpp"

namespace rlx::cli {

namespace {

// Where rank r's buffers live: the CPU, or with NCCL cuda:r (made the thread's device, as
// NCCL's barrier takes it).
at::Device rank_device(int r, bool nccl) { return nccl ? at::Device(at::kCUDA, static_cast<int8_t>(r)) : at::kCPU; }

// The same bytes as one broadcast per bucket from rank 0 to `ranks - 1` others, each rank a
// thread with its own group member; seconds per version, until every rank has it.
std::vector<double> raw_broadcast(int64_t bytes, int ranks, int64_t bucket_bytes, int64_t versions, bool nccl) {
  dist::StoreServer store("127.0.0.1", 0);
  std::vector<double> out;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      dist::RendezvousOptions ro;
      ro.rank = r;
      ro.world_size = ranks;
      ro.store_port = store.port();
      ro.prefix = "raw";
      ro.timeout_s = 120;
      ro.nccl = nccl;
      dist::use_device_for_collectives(rank_device(r, nccl));
      auto comm = dist::connect(ro);
      auto buf = at::full({bytes}, r == 0 ? 7 : 0, at::TensorOptions().dtype(at::kByte).device(rank_device(r, nccl)));
      for (int64_t v = 0; v <= versions; ++v) {  // the first is a warm-up
        comm->barrier("start");
        const double t0 = now_s();
        for (int64_t at = 0; at < bytes; at += bucket_bytes)
          comm->broadcast(buf.narrow(0, at, std::min(bucket_bytes, bytes - at)), 0, "raw")->wait();
        comm->barrier("end");
        if (r == 0 && v > 0) out.push_back(now_s() - t0);
      }
      RLX_CHECK(buf[bytes - 1].item<int>() == 7, "bench sync: the raw broadcast lost bytes");
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

nlohmann::json broadcast_versions(std::vector<std::pair<std::string, at::Tensor>>& w, const dist::WeightLayout& layout,
                                  int64_t versions, int subscribers, int64_t bucket_mb, bool nccl) {
  dist::BroadcastSyncOptions o{.bind = "tcp://127.0.0.1:0",
                               .advertise_host = "127.0.0.1",
                               .bucket_mb = bucket_mb,
                               .timeout_s = 120,
                               .nccl = nccl,
                               .device = rank_device(0, nccl).str()};
  dist::use_device_for_collectives(rank_device(0, nccl));  // publish() runs on this thread
  dist::BroadcastWeightPublisher pub(o, layout);
  std::vector<std::unique_ptr<dist::BroadcastWeightSubscriber>> subs;
  for (int i = 0; i < subscribers; ++i) {
    auto so = o;
    so.endpoint = pub.endpoint();
    so.device = rank_device(i + 1, nccl).str();
    subs.push_back(std::make_unique<dist::BroadcastWeightSubscriber>(so));
  }
  int64_t v = 0;
  // Every subscriber holds version v (a timeout is an error).
  auto delivered = [&](int64_t version) {
    const double end = now_s() + 120;
    for (auto& s : subs) {
      while (s->version() < version) {
        if (auto u = s->poll(); !u) {
          RLX_CHECK(now_s() < end, "bench sync: a broadcast subscriber did not get version {}", version);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    }
  };
  const double end = now_s() + 120;
  while (pub.members() < subscribers) {  // joining: versions before everyone is in are not timed
    RLX_CHECK(now_s() < end, "bench sync: {} of {} subscribers joined", pub.members(), subscribers);
    pub.publish(++v, w);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  pub.publish(++v, w);  // a warm-up in the formed group
  delivered(v);
  std::vector<double> pub_s, total_s;
  for (int64_t i = 0; i < versions; ++i) {
    for (auto& [n, t] : w) t.fill_(static_cast<double>(v + 1));
    const double t0 = now_s();
    pub.publish(++v, w);
    pub_s.push_back(now_s() - t0);
    delivered(v);
    total_s.push_back(now_s() - t0);
  }
  const double bytes = static_cast<double>(layout.bytes());
  const double raw = median(raw_broadcast(layout.bytes(), subscribers + 1, bucket_mb << 20, versions, nccl));
  return {{"data_plane", nccl ? "nccl" : "gloo"},
          {"subscribers", subscribers},
          {"bucket_mb", bucket_mb},
          {"generation", pub.generation()},
          {"publish_ms", median(pub_s) * 1e3},
          {"ms_per_version", median(total_s) * 1e3},
          {"raw_broadcast_ms", raw * 1e3},
          {"gbps", bytes / median(total_s) / 1e9},
          {"vs_raw_broadcast", raw / median(total_s)}};
}

}  // namespace rlx::cli
