// The hub's saved state (hub.hpp: write_snapshot, read_snapshot): its replay buffer, leases
// and prompt cursor in one checked file, written atomically.
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "rlx/bus/hub.hpp"
#include "rlx/core/error.hpp"

namespace rlx::bus {

namespace {
void write_all(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    RLX_CHECK(n > 0, "cannot write {}: {}", path, std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

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
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RLX_CHECK(fd >= 0, "cannot create {}: {}", tmp, std::strerror(errno));
  try {
    write_all(fd, bytes, tmp);
    RLX_CHECK(::fsync(fd) == 0, "fsync {}: {}", tmp, std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  RLX_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "rename {} -> {}: {}", tmp, path, std::strerror(errno));
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
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
