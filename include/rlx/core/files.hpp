// Durable files: atomic replacement (temporary file, fsync, rename, fsync of the
// directory), fsync of a path, and whole-file checksums.
//
//   rlx::write_file_atomic(dir / "MANIFEST.json", text);
//   uint64_t h = rlx::file_xxh64(dir / "rank-0.safetensors");
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace rlx {

// Writes all of `bytes` to `fd` (retrying short writes and EINTR); false on an error.
bool write_all(int fd, std::string_view bytes) noexcept;
// A file replaced whole: written to PATH.tmp-PID, then renamed over PATH by commit(), so
// that a reader or a crash sees the old file or the new one. Durable (the default): the
// file and its directory are fsynced too, so the new file survives a power loss. Not
// committed (an error, an exception): the temporary file is removed.
//
//   rlx::AtomicFile f(dir / "model.safetensors");
//   f.write(header); f.write(data, n);
//   f.commit();
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, bool durable = true);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);  // throws rlx::Error naming the file
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  bool durable_;
  int fd_ = -1;
};
// One AtomicFile write of `bytes`.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes, bool durable = true);
// fsync of a file or a directory; throws rlx::Error naming the path.
void fsync_path(const std::filesystem::path& path);
// xxh64 (seed 0) of the file's contents.
uint64_t file_xxh64(const std::filesystem::path& path);
// The whole file, bounded: a file larger than max_bytes is an error naming it.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes);
// Removes a file or a directory tree (symbolic links themselves, never what they point
// to); a missing path removes nothing. Returns the entries removed. It stands in for
// std::filesystem::remove_all, which PyTorch 2.x wheels interpose with a broken copy of
// their own: libtorch.so exports libstdc++'s filesystem symbols (pytorch/pytorch#133437),
// and a call bound to its remove_all crashed (seen with torch 2.11 on the CUDA machine).
uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept;
// As above; throws rlx::Error naming the path and the cause.
uintmax_t remove_tree(const std::filesystem::path& path);

// An exclusive lock on a file (flock), held while the object lives: a process that dies,
// however it dies, lets go of it. Not inherited by child processes. The file holds the
// holder's PID, so whoever is refused can name it.
//
//   int64_t holder = 0;
//   auto lock = rlx::FileLock::try_lock(run_dir / "launcher.lock", holder);
//   RLX_CHECK(lock, "{} is in use by process {}", run_dir.string(), holder);
class FileLock {
 public:
  // The lock, or nullopt with `holder` set to the PID written by the process that holds
  // it (0 if unreadable). Throws rlx::Error naming the file if it cannot be opened.
  static std::optional<FileLock> try_lock(const std::filesystem::path& path, int64_t& holder);
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace rlx
