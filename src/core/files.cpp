#include "rlx/core/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "rlx/core/error.hpp"

namespace rlx {

namespace {
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
[[noreturn]] void fail(const std::filesystem::path& p, const char* what) {
  throw Error(fmt::format("{}: {} failed: {}", p.string(), what, std::strerror(errno)));
}
}  // namespace

void fsync_path(const std::filesystem::path& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail(path, "open");
  if (::fsync(f.fd) != 0) fail(path, "fsync");
}

bool write_all(int fd, std::string_view bytes) noexcept {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

AtomicFile::AtomicFile(std::filesystem::path path, bool durable)
    : path_(std::move(path)), tmp_(path_), durable_(durable) {
  tmp_ += fmt::format(".tmp-{}", ::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(tmp_, "open");
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  RLX_CHECK(fd_ >= 0, "{}: written after commit", path_.string());
  if (!write_all(fd_, std::string_view(static_cast<const char*>(data), bytes))) fail(tmp_, "write");
}

void AtomicFile::commit() {
  RLX_CHECK(fd_ >= 0, "{}: committed twice", path_.string());
  if (durable_ && ::fsync(fd_) != 0) fail(tmp_, "fsync");
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    errno = err;
    fail(path_, "rename");
  }
  if (durable_) fsync_path(path_.parent_path().empty() ? std::filesystem::path(".") : path_.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes, bool durable) {
  AtomicFile f(path, durable);
  f.write(bytes);
  f.commit();
}

uint64_t file_xxh64(const std::filesystem::path& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail(path, "open");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(f.fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      XXH64_freeState(st);
      fail(path, "read");
    }
    if (n == 0) break;
    XXH64_update(st, buf.data(), static_cast<size_t>(n));
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

std::string read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(fmt::format("{}: cannot read: {}", path.string(), ec.message()));
  RLX_CHECK(size <= max_bytes, "{}: {} bytes, more than the {} allowed", path.string(), size, max_bytes);
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail(path, "open");
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(f.fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "read");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

namespace {
// nftw hands its callback no context: the walk's counters live per thread.
thread_local uintmax_t tree_removed = 0;
thread_local int tree_errno = 0;

int remove_entry(const char* path, const struct stat*, int type, struct FTW*) {
  const int rc = type == FTW_DP ? ::rmdir(path) : ::unlink(path);
  if (rc != 0 && errno != ENOENT) {
    tree_errno = errno;
    return 1;  // stop the walk
  }
  if (rc == 0) ++tree_removed;
  return 0;
}
}  // namespace

uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return 0;
  }
  tree_removed = 0;
  tree_errno = 0;
  // Depth first (children before their directory), not following symbolic links, at most
  // 64 directory descriptors open at once.
  const int rc = ::nftw(path.c_str(), remove_entry, 64, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) ec.assign(tree_errno ? tree_errno : (errno ? errno : EIO), std::generic_category());
  return tree_removed;
}

uintmax_t remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  const auto n = remove_tree(path, ec);
  RLX_CHECK(!ec, "cannot remove {}: {}", path.string(), ec.message());
  return n;
}

std::optional<FileLock> FileLock::try_lock(const std::filesystem::path& path, int64_t& holder) {
  holder = 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "open");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    if (::pread(fd, buf, sizeof buf - 1, 0) > 0) holder = std::strtoll(buf, nullptr, 10);
    ::close(fd);
    if (err == EWOULDBLOCK) return std::nullopt;
    errno = err;
    fail(path, "flock");
  }
  const auto pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd);
    fail(path, "write");
  }
  return FileLock(fd);
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace rlx
