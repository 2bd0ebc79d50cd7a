#include "rlx/bus/message.hpp"

#include <fmt/format.h>

#include <bit>
#include <limits>

#include "rlx/core/hash.hpp"

namespace rlx::bus {

std::string_view to_string(MsgType t) {
  switch (t) {
    case MsgType::hello: return "hello";
    case MsgType::welcome: return "welcome";
    case MsgType::lease_request: return "lease_request";
    case MsgType::lease_grant: return "lease_grant";
    case MsgType::trajectory_group: return "trajectory_group";
    case MsgType::ack: return "ack";
    case MsgType::heartbeat: return "heartbeat";
    case MsgType::stats: return "stats";
    case MsgType::error_record: return "error_record";
    case MsgType::batch_request: return "batch_request";
    case MsgType::batch: return "batch";
    case MsgType::version_update: return "version_update";
    case MsgType::control: return "control";
    case MsgType::hub_state: return "hub_state";
    case MsgType::env_request: return "env_request";
    case MsgType::env_reply: return "env_reply";
  }
  return "unknown";
}

bool is_known(uint16_t type) { return type >= 1 && type <= static_cast<uint16_t>(MsgType::env_reply); }

std::string_view to_string(Reject r) {
  switch (r) {
    case Reject::truncated: return "truncated";
    case Reject::bad_magic: return "bad_magic";
    case Reject::bad_version: return "bad_version";
    case Reject::unknown_type: return "unknown_type";
    case Reject::oversize: return "oversize";
    case Reject::length_mismatch: return "length_mismatch";
    case Reject::checksum: return "checksum";
    case Reject::malformed: return "malformed";
  }
  return "?";
}

namespace {
// Fixed little-endian layout (x86 and ARM Linux are little-endian; checked at compile time).
static_assert(std::endian::native == std::endian::little, "rlx's wire format assumes a little-endian host");
template <class T>
void put(std::string& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}
template <class T>
T get(std::string_view in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}
}  // namespace

void seal_frame(std::string& frame, MsgType type, uint64_t seq) {
  RLX_ASSERT(frame.size() >= kHeaderBytes, "frame shorter than its header");
  const size_t n = frame.size() - kHeaderBytes;
  put<uint32_t>(frame, 0, kMagic);
  put<uint16_t>(frame, 4, kProtocolVersion);
  put<uint16_t>(frame, 6, static_cast<uint16_t>(type));
  put<uint32_t>(frame, 8, 0);
  put<uint64_t>(frame, 12, seq);
  put<uint64_t>(frame, 20, n);
  put<uint64_t>(frame, 28, hash64(frame.data() + kHeaderBytes, n, static_cast<uint16_t>(type)));
  put<uint32_t>(frame, 36, 0);
}

std::string encode_frame(MsgType type, uint64_t seq, std::string_view payload) {
  std::string out(kHeaderBytes, '\0');
  out.append(payload);
  seal_frame(out, type, seq);
  return out;
}

Frame decode_frame(std::string_view bytes, const Limits& limits) {
  if (bytes.size() < kHeaderBytes)
    throw FrameError(Reject::truncated, fmt::format("frame of {} bytes is shorter than the {}-byte header", bytes.size(), kHeaderBytes));
  if (get<uint32_t>(bytes, 0) != kMagic)
    throw FrameError(Reject::bad_magic, fmt::format("bad magic {:#010x} (want {:#010x}): not an rlx bus frame",
                                                    get<uint32_t>(bytes, 0), kMagic));
  const auto version = get<uint16_t>(bytes, 4);
  if (version != kProtocolVersion)
    throw FrameError(Reject::bad_version,
                     fmt::format("protocol version {} (this build speaks {})", version, kProtocolVersion));
  const auto type = get<uint16_t>(bytes, 6);
  if (!is_known(type)) throw FrameError(Reject::unknown_type, fmt::format("unknown message type {}", type));
  const auto len = get<uint64_t>(bytes, 20);
  if (len > limits.max_frame_bytes)
    throw FrameError(Reject::oversize, fmt::format("payload of {} bytes exceeds the limit of {}", len, limits.max_frame_bytes));
  if (len != bytes.size() - kHeaderBytes)
    throw FrameError(Reject::length_mismatch,
                     fmt::format("header says {} payload bytes, the frame has {}", len, bytes.size() - kHeaderBytes));
  const auto payload = bytes.substr(kHeaderBytes);
  if (hash64(payload.data(), payload.size(), type) != get<uint64_t>(bytes, 28))
    throw FrameError(Reject::checksum, "payload checksum mismatch");
  return {static_cast<MsgType>(type), get<uint64_t>(bytes, 12), payload};
}

std::pair<int64_t, int64_t> TrajectoryGroup::version_range() const {
  // Branch-free (the hub runs this on every group): a negative version (no version, outside
  // actions) counts as +inf for the minimum and as -1 for the maximum.
  constexpr uint64_t kNone = std::numeric_limits<int64_t>::max();
  uint64_t lo = kNone;
  int64_t hi = -1;
  for (const auto& s : samples)
    for (const int64_t v : s.versions) {
      lo = std::min(lo, v < 0 ? kNone : static_cast<uint64_t>(v));
      hi = std::max(hi, v);
    }
  return hi < 0 ? std::pair<int64_t, int64_t>{-1, -1} : std::pair{static_cast<int64_t>(lo), hi};
}

int64_t TrajectoryGroup::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : samples) n += static_cast<int64_t>(s.tokens.size());
  return n;
}

}  // namespace rlx::bus
