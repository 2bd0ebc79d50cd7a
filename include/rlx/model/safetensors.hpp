// safetensors reading and writing, validated exactly as the format requires.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"k": "v"}}, then the data. Reading checks: N <= 100 MB and
// <= the file; the header is a JSON object of well-formed entries with no
// duplicate names; known dtypes; non-negative shapes whose byte size (checked
// for overflow) equals end - begin; offsets that tile the data from 0 without
// holes or overlap and end exactly at the end of the file. Nothing is allocated
// from a size the file claims before it is checked against the file.
//
//   auto f = rlx::SafetensorsFile::open("model.safetensors");   // memory-mapped
//   at::Tensor w = f.tensor("model.embed_tokens.weight");       // zero-copy when aligned
//   rlx::save_safetensors("out.safetensors", {{"w", w}}, {{"format", "pt"}});
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlx {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length
};

// Bytes per element of a safetensors dtype, or 0 when the name is not a dtype.
size_t safetensors_dtype_size(std::string_view dtype);

// Validates a whole file image and returns its header; throws rlx::Error naming
// `source` and the problem (with the tensor name where there is one).
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view source);

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // The tensor's bytes in the file.
  std::span<const std::byte> bytes(const SafetensorsEntry& e) const;
  // A CPU tensor over the mapped bytes (kept alive by the tensor), or a copy when the
  // data is not aligned for its dtype. Throws for names not in the file, and for
  // dtypes this LibTorch lacks.
  at::Tensor tensor(std::string_view name) const;

 private:
  struct Mapping;
  std::filesystem::path path_;
  std::shared_ptr<Mapping> mapping_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> by_name_;  // name -> index in header_.entries
};

struct SafetensorsSaveOptions {
  bool fsync = true;  // fsync the file and its directory before returning
};

// Writes the tensors (contiguous CPU copies are made as needed) in the given order,
// atomically: a temporary file in the same directory, then rename.
void save_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {}, SafetensorsSaveOptions options = {});

// The safetensors dtype name of a ScalarType; throws for types the format lacks.
std::string safetensors_dtype_name(at::ScalarType t);

}  // namespace rlx
