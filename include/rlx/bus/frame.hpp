// The bus's frame: a 40-byte little-endian header and a payload:
//   magic "RLXB" | protocol version u16 | type u16 | reserved u32 | seq u64 |
//   payload length u64 | xxh3-64(payload, seed = type) (rlx::hash64)
// decode_frame() rejects a frame whose magic, version, type, length or checksum is
// wrong, naming the reason (FrameError::reason, for counters). The messages a payload holds
// are message.hpp's.
//
//   auto frame = rlx::bus::decode_frame(wire, limits);      // throws FrameError
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rlx/core/error.hpp"

namespace rlx::bus {

inline constexpr uint32_t kMagic = 0x42584c52;  // "RLXB" little-endian
// 8: a learner's checkpoint is a CheckpointSaved message, a control command a
// ControlCommand and an env request's op an EnvOp, each a type, not text parsed back;
// 7: a sample carries its mixture-of-experts routing (layers u16, top_k u16, int16 values
// after its metadata); 6: batches and batch requests no longer carry learner ranks (the
// learner splits a batch itself); 5: a sample's weight versions are runs (VersionRuns), not
// a value per token; 4: a batch request says which batches the learner has received (it may
// ask for one ahead); 3: a batch is a multipart message (a BatchHead frame, then its groups'
// frames as the workers sent them); 2: the checksum is XXH3-64 (1: XXH64).
inline constexpr uint16_t kProtocolVersion = 8;
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
  version_update = 12,
  control = 13,
  hub_state = 14,  // the hub's saved state (a file, never on the wire)
  env_request = 15,
  env_reply = 16,
  bye = 17,
  checkpoint_saved = 18,
};
inline constexpr MsgType kLastMsgType = MsgType::checkpoint_saved;
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

}  // namespace rlx::bus
