// Bus messages: cereal-serialized structs inside a framed, versioned, checksummed
// envelope, decoded with every length bounded before anything is allocated.
//
// A frame is a 40-byte little-endian header and a payload:
//   magic "RLXB" | protocol version u16 | type u16 | reserved u32 | seq u64 |
//   payload length u64 | xxh64(payload, seed = type)
// decode_frame() rejects a frame whose magic, version, type, length or checksum is
// wrong, naming the reason (FrameError::reason, for counters). unpack() reads the
// payload with BoundedInputArchive: a vector or string length is checked against
// the bytes that remain (and Limits::max_elements) before the container grows, so a
// peer claiming 2^62 elements costs nothing. A payload must be consumed exactly.
//
//   std::string wire = rlx::bus::pack(rlx::bus::Heartbeat{.who = "worker-3"}, /*seq=*/7);
//   auto frame = rlx::bus::decode_frame(wire, limits);      // throws FrameError
//   auto hb = rlx::bus::unpack<rlx::bus::Heartbeat>(frame, limits);
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlx/core/error.hpp"

namespace rlx::bus {

inline constexpr uint32_t kMagic = 0x42584c52;  // "RLXB" little-endian
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kHeaderBytes = 40;

enum class MsgType : uint16_t {
  hello = 1,
  welcome = 2,
  lease_request = 3,
  lease_grant = 4,
  trajectory_group = 5,
  ack = 6,
  heartbeat = 7,
  stats = 8,
  error_record = 9,
  batch_request = 10,
  batch = 11,
};
std::string_view to_string(MsgType t);
bool is_known(uint16_t type);

struct Limits {
  uint64_t max_frame_bytes = uint64_t{256} << 20;  // payload bytes
  uint64_t max_elements = uint64_t{1} << 28;       // per vector or string
};

// Why a frame or payload was rejected.
enum class Reject { truncated, bad_magic, bad_version, unknown_type, oversize, length_mismatch, checksum, malformed };
std::string_view to_string(Reject r);

class FrameError : public Error {
 public:
  FrameError(Reject reason, const std::string& what) : Error(what), reason_(reason) {}
  Reject reason() const { return reason_; }

 private:
  Reject reason_;
};

struct Frame {
  MsgType type;
  uint64_t seq = 0;
  std::string_view payload;  // points into the decoded bytes
};

std::string encode_frame(MsgType type, uint64_t seq, std::string_view payload);
Frame decode_frame(std::string_view bytes, const Limits& limits);

// --- the archive that reads payloads -------------------------------------------------

class BoundedInputArchive : public cereal::InputArchive<BoundedInputArchive, cereal::AllowEmptyClassElision> {
 public:
  BoundedInputArchive(std::string_view bytes, const Limits& limits)
      : cereal::InputArchive<BoundedInputArchive, cereal::AllowEmptyClassElision>(this), data_(bytes), limits_(limits) {}

  void read(void* out, size_t n) {
    if (n > remaining())
      throw FrameError(Reject::malformed, "payload ends early: " + std::to_string(n) + " bytes wanted, " +
                                              std::to_string(remaining()) + " left");
    if (n == 0) return;  // an empty container's data() may be null
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
  }
  size_t remaining() const { return data_.size() - pos_; }
  // A container of `n` elements, each at least `min_wire_bytes` on the wire, may follow.
  void check_length(uint64_t n, size_t min_wire_bytes, std::string_view what) const {
    if (n > limits_.max_elements || n > remaining() / std::max<size_t>(1, min_wire_bytes))
      throw FrameError(Reject::malformed, std::string(what) + " claims " + std::to_string(n) + " elements, " +
                                              std::to_string(remaining()) + " payload bytes remain (limit " +
                                              std::to_string(limits_.max_elements) + " elements)");
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  const Limits& limits_;
};

// Primitive loads of the archive.
template <class T>
  requires std::is_arithmetic_v<T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, T& t) {
  ar.read(&t, sizeof(T));
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::SizeTag<T>& t) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  t.size = static_cast<std::remove_reference_t<T>>(n);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::BinaryData<T>& b) {
  ar.read(b.data, static_cast<size_t>(b.size));
}
// Containers: the length is checked before the container grows.
template <class T, class A>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, std::vector<T, A>& v) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    ar.check_length(n, sizeof(T), "a vector");
    v.resize(static_cast<size_t>(n));
    ar.read(v.data(), static_cast<size_t>(n) * sizeof(T));
  } else {
    ar.check_length(n, 1, "a vector");
    v.clear();
    for (uint64_t i = 0; i < n; ++i) ar(v.emplace_back());  // grows only as elements arrive
  }
}
template <class C, class Tr, class A>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, std::basic_string<C, Tr, A>& s) {
  uint64_t n = 0;
  ar.read(&n, sizeof(n));
  ar.check_length(n, sizeof(C), "a string");
  s.resize(static_cast<size_t>(n));
  ar.read(s.data(), static_cast<size_t>(n) * sizeof(C));
}

// --- messages ----------------------------------------------------------------------------

// A worker or learner introduces itself; `incarnation` changes on every restart.
struct Hello {
  static constexpr MsgType kType = MsgType::hello;
  std::string who;
  std::string role;  // "worker" or "learner"
  uint64_t incarnation = 0;
  template <class Ar> void serialize(Ar& ar) { ar(who, role, incarnation); }
};

// The hub's answer to Hello: credits to send trajectory groups with, and settings.
struct Welcome {
  static constexpr MsgType kType = MsgType::welcome;
  uint64_t credits = 0;
  double heartbeat_s = 1.0;
  double lease_timeout_s = 60.0;
  template <class Ar> void serialize(Ar& ar) { ar(credits, heartbeat_s, lease_timeout_s); }
};

struct LeaseRequest {
  static constexpr MsgType kType = MsgType::lease_request;
  uint32_t max_leases = 1;
  template <class Ar> void serialize(Ar& ar) { ar(max_leases); }
};

// One prompt group to generate: the task (JSON text from the dataset), its group size,
// and the oldest weight version the hub will accept for it.
struct Lease {
  uint64_t lease_id = 0;
  uint64_t prompt_index = 0;  // position in the dataset
  uint64_t epoch = 0;
  uint32_t group_size = 1;
  int64_t min_version = 0;
  uint32_t attempt = 0;       // 0 first time; incremented on every re-issue
  std::string task;           // the dataset record (JSON)
  template <class Ar> void serialize(Ar& ar) { ar(lease_id, prompt_index, epoch, group_size, min_version, attempt, task); }
  bool operator==(const Lease&) const = default;
};

struct LeaseGrant {
  static constexpr MsgType kType = MsgType::lease_grant;
  std::vector<Lease> leases;  // empty: nothing to hand out now (retry later)
  bool exhausted = false;     // the prompt source is finished (a run's last epoch)
  template <class Ar> void serialize(Ar& ar) { ar(leases, exhausted); }
};

// One sample of a group: exact tokens, what the loss sees, behaviour log-probs, reward.
struct Trajectory {
  std::vector<int32_t> tokens;      // prompt + completion (+ environment turns)
  std::vector<uint8_t> loss_mask;   // per token: 1 where the policy produced it
  std::vector<float> logprobs;      // per token: behaviour log-prob (0 where mask is 0)
  std::vector<int64_t> versions;    // per token: weight version (-1 where mask is 0)
  int32_t prompt_len = 0;
  float reward = 0;
  std::string finish;               // "stop", "length", "abort", ...
  std::string metadata;             // environment info (JSON)
  template <class Ar> void serialize(Ar& ar) { ar(tokens, loss_mask, logprobs, versions, prompt_len, reward, finish, metadata); }
  bool operator==(const Trajectory&) const = default;
};

struct TrajectoryGroup {
  static constexpr MsgType kType = MsgType::trajectory_group;
  uint64_t lease_id = 0;
  uint64_t prompt_index = 0;
  uint64_t epoch = 0;
  std::string worker;
  std::vector<Trajectory> samples;
  template <class Ar> void serialize(Ar& ar) { ar(lease_id, prompt_index, epoch, worker, samples); }
  bool operator==(const TrajectoryGroup&) const = default;
  // Smallest and largest weight version over the generated tokens (-1, -1 if none).
  std::pair<int64_t, int64_t> version_range() const;
  int64_t num_tokens() const;
};

// The hub's receipt for a frame `seq` of the sender, with the sender's credits now.
struct Ack {
  static constexpr MsgType kType = MsgType::ack;
  uint64_t seq = 0;
  uint64_t credits = 0;
  bool duplicate = false;  // the lease had already ended; nothing was added
  template <class Ar> void serialize(Ar& ar) { ar(seq, credits, duplicate); }
};

struct Heartbeat {
  static constexpr MsgType kType = MsgType::heartbeat;
  std::string who;
  template <class Ar> void serialize(Ar& ar) { ar(who); }
};

// A lease that ended without a trajectory group, and why.
struct ErrorRecord {
  static constexpr MsgType kType = MsgType::error_record;
  uint64_t lease_id = 0;
  std::string kind;    // "infra" (worker died, timeout; retried) or "data" (the task itself failed; not retried)
  std::string reason;
  template <class Ar> void serialize(Ar& ar) { ar(lease_id, kind, reason); }
  bool operator==(const ErrorRecord&) const = default;
};

struct Stats {
  static constexpr MsgType kType = MsgType::stats;
  std::vector<std::pair<std::string, double>> values;
  template <class Ar> void serialize(Ar& ar) { ar(values); }
};

// A learner asks for the next batch: up to `max_groups` groups (0: no limit) or
// `max_tokens` tokens (0: no limit), waiting at most `wait_s` for enough to arrive.
struct BatchRequest {
  static constexpr MsgType kType = MsgType::batch_request;
  uint32_t max_groups = 0;
  uint64_t max_tokens = 0;
  template <class Ar> void serialize(Ar& ar) { ar(max_groups, max_tokens); }
};

struct Batch {
  static constexpr MsgType kType = MsgType::batch;
  std::vector<TrajectoryGroup> groups;
  template <class Ar> void serialize(Ar& ar) { ar(groups); }
};

// --- pack / unpack -------------------------------------------------------------------------

template <class T>
std::string pack(const T& msg, uint64_t seq = 0) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::BinaryOutputArchive ar(os);
    ar(msg);
  }
  return encode_frame(T::kType, seq, os.view());
}

template <class T>
T unpack(const Frame& frame, const Limits& limits) {
  if (frame.type != T::kType)
    throw FrameError(Reject::malformed, "expected a " + std::string(to_string(T::kType)) + " message, got " +
                                            std::string(to_string(frame.type)));
  T msg;
  BoundedInputArchive ar(frame.payload, limits);
  ar(msg);
  if (ar.remaining() != 0)
    throw FrameError(Reject::malformed, std::to_string(ar.remaining()) + " trailing bytes after a " +
                                            std::string(to_string(T::kType)) + " message");
  return msg;
}

}  // namespace rlx::bus

CEREAL_REGISTER_ARCHIVE(rlx::bus::BoundedInputArchive)
// Payloads are written by cereal's BinaryOutputArchive (BinaryInputArchive already claims
// the output-to-input direction).
namespace cereal::traits::detail {
template <>
struct get_output_from_input<rlx::bus::BoundedInputArchive> {
  using type = cereal::BinaryOutputArchive;
};
}  // namespace cereal::traits::detail
