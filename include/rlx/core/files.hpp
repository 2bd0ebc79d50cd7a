// Durable files: atomic replacement (temporary file, fsync, rename, fsync of the
// directory), fsync of a path, and whole-file checksums.
//
//   rlx::write_file_atomic(dir / "MANIFEST.json", text);
//   uint64_t h = rlx::file_xxh64(dir / "rank-0.safetensors");
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace rlx {

// Writes `bytes` to `path` so that a crash leaves either the old file or the new one.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
// fsync of a file or a directory; throws rlx::Error naming the path.
void fsync_path(const std::filesystem::path& path);
// xxh64 (seed 0) of the file's contents.
uint64_t file_xxh64(const std::filesystem::path& path);
// The whole file, bounded: a file larger than max_bytes is an error naming it.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes);

}  // namespace rlx
