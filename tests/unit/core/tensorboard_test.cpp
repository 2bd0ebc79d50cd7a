#include "rlx/core/tensorboard.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"

namespace fs = std::filesystem;

TEST_CASE("tensorboard: CRC-32C and TFRecord's mask", "[tensorboard]") {
  CHECK(rlx::crc32c("") == 0u);
  CHECK(rlx::crc32c("123456789") == 0xE3069283u);  // the Castagnoli check value
  CHECK(rlx::crc32c(std::string(32, '\0')) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  const uint32_t c = rlx::crc32c("123456789");
  CHECK(rlx::masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("tensorboard: scalars round-trip through an event file; corruption is reported with its offset", "[tensorboard]") {
  const fs::path dir = fs::temp_directory_path() / "rlx_tensorboard_test";
  rlx::remove_tree(dir);
  fs::path file;
  {
    rlx::TensorBoardWriter w(dir);
    file = w.file();
    for (int64_t step = 1; step <= 3; ++step)
      w.add_scalars(step, {{"reward_mean", 0.5 * static_cast<double>(step)}, {"finish", "stop"}, {"nested", {{"a", 2}}},
                           {"nan", std::nan("")}, {"flag", true}},
                    100.0 + static_cast<double>(step));
    w.flush();
  }
  CHECK(file.filename().string().rfind("events.out.tfevents.", 0) == 0);
  auto events = rlx::read_tensorboard_events(file);
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[3].step == 3);
  CHECK(events[3].wall_time == 103.0);
  using Scalars = std::vector<std::pair<std::string, float>>;
  CHECK(events[3].scalars == Scalars{{"flag", 1.0f}, {"nested/a", 2.0f}, {"reward_mean", 1.5f}});  // text and NaN skipped

  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(file, std::ios::binary | std::ios::trunc) << b; };
  // The first record's size: 12 header bytes, its payload, 4 CRC bytes.
  const size_t first = 12 + static_cast<size_t>(static_cast<unsigned char>(bytes[0])) + 4;
  std::string flipped = bytes;
  flipped[first + 20] ^= 0x40;  // inside the second record's payload
  write(flipped);
  CHECK_THROWS_WITH(rlx::read_tensorboard_events(file), Catch::Contains(fmt::format("record at byte {}", first)) &&
                                                          Catch::Contains("CRC"));
  write(bytes.substr(0, bytes.size() - 3));  // a cut-off write
  CHECK_THROWS_WITH(rlx::read_tensorboard_events(file), Catch::Contains("cut short"));
  write(bytes);
  CHECK(rlx::read_tensorboard_events(file).size() == 4);
  rlx::remove_tree(dir);
}

TEST_CASE("tensorboard: text for the text plugin round-trips; a scalar of 0 is on the wire", "[tensorboard]") {
  const fs::path dir = fs::temp_directory_path() / "rlx_tensorboard_text_test";
  rlx::remove_tree(dir);
  fs::path file;
  const std::string text = "**sample 1** reward 1\n\n    prompt: 2+2=\n\u00e9";
  {
    rlx::TensorBoardWriter w(dir);
    file = w.file();
    w.add_text(7, "samples", text, 50.0);
    w.add_scalars(8, {{"zero", 0.0}, {"one", 1.0}}, 51.0);
    w.flush();
  }
  auto events = rlx::read_tensorboard_events(file);
  REQUIRE(events.size() == 3);
  CHECK(events[1].step == 7);
  CHECK(events[1].scalars.empty());
  REQUIRE(events[1].texts.size() == 1);
  CHECK(events[1].texts[0] == std::pair<std::string, std::string>{"samples", text});
  using Scalars = std::vector<std::pair<std::string, float>>;
  CHECK(events[2].scalars == Scalars{{"one", 1.0f}, {"zero", 0.0f}});
  CHECK(events[2].texts.empty());
  // TensorBoard reads a value by the field it holds: a scalar 0 must carry simple_value
  // (field 2, fixed32: tag byte 0x15) rather than leave it out as proto3's default.
  std::ifstream in(file, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  CHECK(bytes.find(std::string("zero\x15\0\0\0\0", 9)) != std::string::npos);
  // The text value names its plugin and holds a DT_STRING (7) tensor.
  CHECK(bytes.find("text") != std::string::npos);
  rlx::remove_tree(dir);
}
