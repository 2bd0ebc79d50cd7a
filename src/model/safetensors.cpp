#include "rlx/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"
#include "rlx/core/torch_compat.hpp"

namespace rlx {

using nlohmann::json;

size_t safetensors_dtype_size(std::string_view d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  if (d == "I16" || d == "U16" || d == "F16" || d == "BF16") return 2;
  if (d == "I32" || d == "U32" || d == "F32") return 4;
  if (d == "I64" || d == "U64" || d == "F64") return 8;
  return 0;
}

std::string safetensors_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: break;
  }
#if RLX_TORCH_AT_LEAST(2, 1)
  if (t == at::kFloat8_e4m3fn) return "F8_E4M3";
  if (t == at::kFloat8_e5m2) return "F8_E5M2";
#endif
  throw Error(fmt::format("safetensors has no dtype for {}", c10::toString(t)));
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view source) {
  auto fail = [&](const std::string& what) -> Error { return Error(fmt::format("{}: invalid safetensors: {}", source, what)); };
  if (file.size() < 8) throw fail(fmt::format("file is {} bytes, shorter than the 8-byte header length", file.size()));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  if (n > kSafetensorsMaxHeaderBytes)
    throw fail(fmt::format("header length {} exceeds the {} byte limit", n, kSafetensorsMaxHeaderBytes));
  if (n > file.size() - 8) throw fail(fmt::format("header length {} exceeds the {} bytes after it", n, file.size() - 8));
  if (n < 2) throw fail(fmt::format("header length {} is too short for a JSON object", n));
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  if (text[0] != '{') throw fail("header does not start with '{'");

  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t ev, json& j) {
    if (ev == json::parse_event_t::key && depth == 1 && !seen.insert(j.get<std::string>()).second && duplicate.empty())
      duplicate = j.get<std::string>();
    return true;
  };
  json root;
  try {
    root = json::parse(text, text + n, on_event);
  } catch (const json::exception& e) {
    throw fail(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!duplicate.empty()) throw fail(fmt::format("tensor '{}' appears twice in the header", duplicate));
  if (!root.is_object()) throw fail("header is not a JSON object");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_len = file.size() - h.data_offset;
  for (auto& [name, e] : root.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) throw fail("__metadata__ is not an object");
      for (auto& [k, v] : e.items()) {
        if (!v.is_string()) throw fail(fmt::format("__metadata__ value of '{}' is not a string", k));
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return fail(fmt::format("tensor '{}': {}", name, what)); };
    if (!e.is_object()) throw bad("entry is not an object");
    for (auto& [k, _] : e.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets") throw bad(fmt::format("unknown field '{}'", k));
    if (!e.contains("dtype") || !e["dtype"].is_string()) throw bad("missing or non-string 'dtype'");
    if (!e.contains("shape") || !e["shape"].is_array()) throw bad("missing or non-array 'shape'");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      throw bad("'data_offsets' must be an array of two integers");
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = e["dtype"].get<std::string>();
    const size_t elem = safetensors_dtype_size(entry.dtype);
    if (elem == 0) throw bad(fmt::format("unknown dtype '{}'", entry.dtype));
    uint64_t bytes = elem;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw bad(fmt::format("shape {} has a dimension that is not a non-negative integer", e["shape"].dump()));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, dim, &bytes))
        throw bad(fmt::format("shape {} overflows 64-bit byte counts", e["shape"].dump()));
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : e["data_offsets"])
      if (!o.is_number_unsigned()) throw bad("'data_offsets' must be non-negative integers");
    entry.begin = e["data_offsets"][0].get<uint64_t>();
    entry.end = e["data_offsets"][1].get<uint64_t>();
    if (entry.begin > entry.end) throw bad(fmt::format("data_offsets [{}, {}] run backwards", entry.begin, entry.end));
    if (entry.end > data_len)
      throw bad(fmt::format("data_offsets end {} is past the {} data bytes in the file", entry.end, data_len));
    if (entry.end - entry.begin != bytes)
      throw bad(fmt::format("{} x shape {} needs {} bytes but data_offsets span {}", entry.dtype, e["shape"].dump(), bytes,
                            entry.end - entry.begin));
    h.entries.push_back(std::move(entry));
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t expected = 0;
  for (const auto& e : h.entries) {
    if (e.begin < expected) throw fail(fmt::format("tensor '{}' overlaps the tensor before it (starts at {}, previous ends at {})", e.name, e.begin, expected));
    if (e.begin > expected) throw fail(fmt::format("hole of {} bytes before tensor '{}' (at {})", e.begin - expected, e.name, expected));
    expected = e.end;
  }
  if (expected != data_len)
    throw fail(fmt::format("tensors cover {} data bytes but the file has {} after the header", expected, data_len));
  return h;
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr && size) ::munmap(addr, size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path.string()));
  }
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = std::make_shared<Mapping>();
  f.mapping_->size = static_cast<size_t>(st.st_size);
  if (st.st_size > 0) {
    // Private and writable: a caller that writes into a tensor gets its own pages.
    void* addr = ::mmap(nullptr, f.mapping_->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(fmt::format("{}: mmap failed: {}", path.string(), std::strerror(err)));
    }
    f.mapping_->addr = addr;
  }
  ::close(fd);
  f.header_ = parse_safetensors({static_cast<const std::byte*>(f.mapping_->addr), f.mapping_->size}, path.string());
  for (size_t i = 0; i < f.header_.entries.size(); ++i) f.by_name_.emplace(f.header_.entries[i].name, i);
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.entries[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsEntry& e) const {
  auto base = static_cast<const std::byte*>(mapping_->addr) + header_.data_offset;
  return {base + e.begin, static_cast<size_t>(e.end - e.begin)};
}

at::Tensor SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) throw Error(fmt::format("{}: no tensor named '{}'", path_.string(), name));
  auto st = compat::scalar_type_for(e->dtype);
  if (!st) throw Error(fmt::format("{}: tensor '{}' has dtype {}, which this LibTorch ({}) cannot hold", path_.string(),
                                   name, e->dtype, TORCH_VERSION));
  auto opts = at::TensorOptions().dtype(*st);
  auto data = bytes(*e);
  if (data.empty()) return at::empty(e->shape, opts);
  void* ptr = const_cast<std::byte*>(data.data());
  const size_t elem = safetensors_dtype_size(e->dtype);
  if (reinterpret_cast<uintptr_t>(ptr) % elem != 0) {
    auto out = at::empty(e->shape, opts);
    std::memcpy(out.data_ptr(), ptr, data.size());
    return out;
  }
  auto keep = mapping_;
  return at::from_blob(ptr, e->shape, [keep](void*) mutable { keep.reset(); }, opts);
}


void save_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, SafetensorsSaveOptions options) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> host;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    RLX_CHECK(name != "__metadata__" && names.insert(name).second, "save_safetensors {}: duplicate or reserved name '{}'",
              path.string(), name);
    auto c = t.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.nbytes());
    header[name] = {{"dtype", safetensors_dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    host.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  AtomicFile f(path, options.fsync);
  f.write(len, 8);
  f.write(text);
  for (const auto& t : host) f.write(t.data_ptr(), t.nbytes());
  f.commit();
}

}  // namespace rlx
