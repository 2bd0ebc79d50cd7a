// What both ends of the broadcast weight path share (weight_broadcast_publisher.cpp,
// weight_broadcast_subscriber.cpp): the control messages' framing, the buckets, the host.
// The control messages, JSON text frames:
//
//   subscriber -> publisher  {"type": "hello", "id"}   on its control socket (answers come there)
//                            {"type": "beat", "id"}    every heartbeat_s, on a socket of its own
//                            {"type": "bye", "id"}
//   publisher -> subscriber  {"type": "welcome", "layout", "layout_hash"}
//                            {"type": "join", "generation", "rank", "world", "store", "prefix", "nccl"}
//                            {"type": "version", "generation", "version", "layout_hash", "buckets": [[offset, bytes], ...]}
//                            {"type": "rejoin"}        to a beat from a member it no longer has
#pragma once

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rlx/dist/comm.hpp"
#include "rlx/dist/rendezvous.hpp"
#include "rlx/dist/weight_broadcast.hpp"

namespace rlx::dist::broadcast {

inline constexpr int64_t kMaxControlBytes = int64_t{64} << 20;  // a welcome carries the layout
inline constexpr int kPollMs = 20;

inline std::string send_text(zmq::socket_t& s, const nlohmann::json& j, zmq::send_flags flags = zmq::send_flags::dontwait) {
  const auto text = j.dump();
  (void)s.send(zmq::buffer(text), flags);
  return text;
}

// A message's JSON, or a discarded value when it is not an object with a string "type".
inline nlohmann::json parse(const zmq::message_t& m) {
  auto j = nlohmann::json::parse(m.to_string_view(), nullptr, false);
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return nlohmann::json::value_t::discarded;
  return j;
}

// Consecutive tensors up to `bucket_bytes` per bucket (a larger tensor alone), as byte ranges
// of the layout's flat version.
inline std::vector<std::pair<int64_t, int64_t>> buckets_of(const WeightLayout& layout, int64_t bucket_bytes) {
  const auto spans = layout.spans();
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0, end = 0;
  for (const auto& [offset, bytes] : spans) {
    const int64_t stop = offset + bytes;
    if (end > begin && stop - begin > bucket_bytes) {
      out.emplace_back(begin, end - begin);
      begin = offset;
    }
    end = stop;
  }
  if (end > begin) out.emplace_back(begin, end - begin);
  return out;
}

inline std::string interface_of(const BroadcastSyncOptions& o) {
  return o.advertise_host.empty() ? host_name() : o.advertise_host;
}

// A thread of either end that runs the group's collectives makes the buffers' device its own
// (use_device_for_collectives), so a publisher or subscriber on cuda:N does not touch cuda:0
// from its helper threads.
inline void use_buffers_device(const BroadcastSyncOptions& o) {
  if (o.nccl) use_device_for_collectives(at::Device(o.device));
}

}  // namespace rlx::dist::broadcast
