// libFuzzer target for the bus decoder: any bytes go through decode_frame and the
// unpack of the type the header names; the only allowed failure is FrameError.
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined ... (see tests/fuzz/run.sh)
#include <cstddef>
#include <cstdint>

#include "rlx/bus/message.hpp"

using namespace rlx::bus;

namespace {
void decode(std::string_view bytes, const Limits& limits) {
  try {
    dispatch(decode_frame(bytes, limits), limits, [](auto&& msg) { (void)msg; });
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
    const auto type = static_cast<MsgType>(1 + data[0] % static_cast<uint16_t>(MsgType::env_reply));
    decode(encode_frame(type, 0, bytes.substr(1)), limits);
  }
  return 0;
}
