// libFuzzer target for the bus decoder: any bytes go through decode_frame and the
// unpack of the type the header names; the only allowed failure is FrameError. A
// trajectory group is also read in place (parse_group, as the hub does): it must accept
// exactly what unpack accepts and read the same group. The bytes are also read as a packed
// batch (what a learner's rank 0 broadcasts to its other ranks), where the only allowed
// failure is rlx::Error, and every group view read from it must lie inside the bytes.
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined ... (see tests/fuzz/run.sh)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>

#include "rlx/bus/message.hpp"

using namespace rlx::bus;

namespace {
void decode(std::string_view bytes, const Limits& limits) {
  std::optional<Frame> frame;
  try {
    frame = decode_frame(bytes, limits);
    dispatch(*frame, limits, [](auto&& msg) { (void)msg; });
  } catch (const FrameError&) {
  }
  if (!frame || frame->type != MsgType::trajectory_group) return;
  std::optional<std::string> in_place, unpacked;  // the group re-packed: compared bytewise (NaN-safe)
  try {
    in_place = pack(to_group(parse_group(*frame, limits)));
  } catch (const FrameError&) {
  }
  try {
    unpacked = pack(unpack<TrajectoryGroup>(*frame, limits));
  } catch (const FrameError&) {
  }
  if (in_place != unpacked) std::abort();  // the hub and the learner would disagree
}

void unpack_packed_batch(std::string_view bytes, const Limits& limits) {
  try {
    const auto batch = unpack_batch(std::make_shared<const std::string>(bytes), limits);
    for (const auto& g : batch.groups) (void)to_group(g);  // reads every view (ASan: inside the bytes)
  } catch (const rlx::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Limits limits{.max_frame_bytes = 1 << 20, .max_elements = 1 << 20};
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  decode(bytes, limits);
  unpack_packed_batch(bytes, limits);
  // The same bytes re-framed with a valid header (type from the first byte), so the
  // mutations reach the payload decoder instead of stopping at the checksum.
  if (size >= 1) {
    const auto type = static_cast<MsgType>(1 + data[0] % static_cast<uint16_t>(kLastMsgType));
    decode(encode_frame(type, 0, bytes.substr(1)), limits);
  }
  return 0;
}
