// libFuzzer target for the bus decoder: any bytes go through decode_frame and the
// unpack of the type the header names; the only allowed failure is FrameError.
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined ... (see tests/fuzz/run.sh)
#include <cstddef>
#include <cstdint>

#include "rlx/bus/message.hpp"

using namespace rlx::bus;

namespace {
template <class T>
void touch(const Frame& f, const Limits& l) {
  T msg = unpack<T>(f, l);
  (void)msg;
}

void decode(std::string_view bytes, const Limits& limits) {
  try {
    const Frame f = decode_frame(bytes, limits);
    switch (f.type) {
      case MsgType::hello: touch<Hello>(f, limits); break;
      case MsgType::welcome: touch<Welcome>(f, limits); break;
      case MsgType::lease_request: touch<LeaseRequest>(f, limits); break;
      case MsgType::lease_grant: touch<LeaseGrant>(f, limits); break;
      case MsgType::trajectory_group: touch<TrajectoryGroup>(f, limits); break;
      case MsgType::ack: touch<Ack>(f, limits); break;
      case MsgType::heartbeat: touch<Heartbeat>(f, limits); break;
      case MsgType::stats: touch<Stats>(f, limits); break;
      case MsgType::error_record: touch<ErrorRecord>(f, limits); break;
      case MsgType::batch_request: touch<BatchRequest>(f, limits); break;
      case MsgType::batch: touch<Batch>(f, limits); break;
    }
  } catch (const FrameError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Limits limits{.max_frame_bytes = 1 << 20, .max_elements = 1 << 20};
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  decode(bytes, limits);
  // The same bytes re-framed with a valid header (type from the first byte), so the
  // mutations reach the payload decoder instead of stopping at the checksum.
  if (size >= 1) {
    const auto type = static_cast<MsgType>(1 + data[0] % static_cast<uint16_t>(MsgType::batch));
    decode(encode_frame(type, 0, bytes.substr(1)), limits);
  }
  return 0;
}
