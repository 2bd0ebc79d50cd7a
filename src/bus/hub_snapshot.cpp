// The hub's saved state (hub.hpp: write_snapshot, read_snapshot): its replay buffer, leases
// and prompt cursor in one checked file, written atomically.
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "rlx/bus/hub.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"

namespace rlx::bus {

namespace {
// A snapshot travels as a framed message: the frame's length and checksum catch a torn file.
struct SnapshotMessage {
  static constexpr MsgType kType = MsgType::hub_state;
  HubSnapshot s;
  template <class Ar> void serialize(Ar& ar) { ar(s); }
};
}  // namespace

void write_snapshot(const HubSnapshot& snapshot, const std::string& path) {
  const std::string bytes = pack(SnapshotMessage{snapshot});
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  write_file_atomic(p, bytes);
}

HubSnapshot read_snapshot(const std::string& path, const Limits& limits) {
  std::ifstream in(path, std::ios::binary);
  RLX_CHECK(in.good(), "cannot read hub state {}", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Limits l = limits;
  l.max_frame_bytes = std::max<uint64_t>(l.max_frame_bytes, bytes.size());
  try {
    const Frame f = decode_frame(bytes, l);
    return unpack<SnapshotMessage>(f, l).s;
  } catch (const FrameError& e) {
    throw Error(fmt::format("hub state {} is damaged ({}): {}", path, to_string(e.reason()), e.what()));
  }
}

}  // namespace rlx::bus
