// TensorBoard event files; see rlx/core/tensorboard.hpp.
#include "rlx/core/tensorboard.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"
#include "tensorboard_proto.hpp"

namespace rlx {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
uint64_t read_le(std::string_view s) {
  uint64_t v = 0;
  for (size_t i = s.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

double now_wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void add_values(std::vector<std::pair<std::string, float>>& scalars, const nlohmann::json& j, const std::string& prefix) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string tag = prefix.empty() ? it.key() : prefix + "/" + it.key();
    if (it->is_object()) {
      add_values(scalars, *it, tag);
    } else if (it->is_number() || it->is_boolean()) {
      double v = it->is_boolean() ? (it->get<bool>() ? 1.0 : 0.0) : it->get<double>();
      if (!std::isfinite(v)) continue;
      scalars.emplace_back(tag, static_cast<float>(v));
    }
  }
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

bool tensorboard_available() { return tb_proto::built(); }

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  RLX_CHECK(tb_proto::built(), "TensorBoard: rlx was built without protobuf (RLX_TENSORBOARD=OFF)");
  std::filesystem::create_directories(dir);
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  const double now = now_wall();
  file_ = dir / fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(now), host, ::getpid());
  out_.open(file_, std::ios::binary | std::ios::trunc);
  RLX_CHECK(out_.good(), "cannot write {}", file_.string());
  write_record(tb_proto::serialize({.wall_time = now, .step = 0, .file_version = "brain.Event:2", .scalars = {}, .texts = {}}));
  flush();
}

void TensorBoardWriter::add_scalars(int64_t step, const nlohmann::json& metrics, double wall_time) {
  RLX_CHECK(metrics.is_object(), "TensorBoard scalars come from a JSON object, got {}", metrics.type_name());
  tb_proto::Event e{.wall_time = wall_time < 0 ? now_wall() : wall_time, .step = step, .file_version = {}, .scalars = {},
                    .texts = {}};
  add_values(e.scalars, metrics, "");
  write_record(tb_proto::serialize(e));
}

void TensorBoardWriter::add_text(int64_t step, const std::string& tag, const std::string& text, double wall_time) {
  RLX_CHECK(!tag.empty(), "TensorBoard text needs a tag");
  tb_proto::Event e{.wall_time = wall_time < 0 ? now_wall() : wall_time, .step = step, .file_version = {}, .scalars = {},
                    .texts = {{tag, text}}};
  write_record(tb_proto::serialize(e));
}

void TensorBoardWriter::write_record(const std::string& payload) {
  const std::string len = le64(payload.size());
  out_ << len << le32(masked_crc32c(len)) << payload << le32(masked_crc32c(payload));
  RLX_CHECK(out_.good(), "cannot write {}", file_.string());
}

void TensorBoardWriter::flush() {
  out_.flush();
  RLX_CHECK(out_.good(), "cannot write {}", file_.string());
}

std::vector<TensorBoardEvent> read_tensorboard_events(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  RLX_CHECK(in.good(), "cannot read {}", file.string());
  std::string data((std::istreambuf_iterator<char>(in)), {});
  std::vector<TensorBoardEvent> events;
  constexpr uint64_t kMaxRecord = 1ull << 30;
  for (size_t off = 0; off < data.size();) {
    RLX_CHECK(data.size() - off >= 12, "{}: the record at byte {} is cut short (its header)", file.string(), off);
    std::string_view len_bytes(data.data() + off, 8);
    const uint64_t len = read_le(len_bytes);
    RLX_CHECK(static_cast<uint32_t>(read_le(std::string_view(data.data() + off + 8, 4))) == masked_crc32c(len_bytes),
              "{}: the record at byte {} has a corrupt length (CRC mismatch)", file.string(), off);
    RLX_CHECK(len <= kMaxRecord && data.size() - off - 12 >= len + 4, "{}: the record at byte {} is cut short ({} bytes announced)",
              file.string(), off, len);
    std::string_view payload(data.data() + off + 12, len);
    RLX_CHECK(static_cast<uint32_t>(read_le(std::string_view(data.data() + off + 12 + len, 4))) == masked_crc32c(payload),
              "{}: the record at byte {} is corrupt (CRC mismatch)", file.string(), off);
    tb_proto::Event e;
    RLX_CHECK(tb_proto::parse(payload, e), "{}: the record at byte {} is not an Event", file.string(), off);
    events.push_back({.wall_time = e.wall_time, .step = e.step, .file_version = std::move(e.file_version),
                      .scalars = std::move(e.scalars), .texts = std::move(e.texts)});
    off += 12 + len + 4;
  }
  return events;
}

}  // namespace rlx
