// TensorBoard event files: scalars per step, and text (TensorBoard's text plugin renders it
// as markdown), as `tensorboard --logdir RUN_DIR/tensorboard` reads them. Each record is TFRecord-framed (length, masked CRC32C of the length, an
// `Event` protobuf, masked CRC32C of it); the first event names the file version.
//
//   rlx::TensorBoardWriter tb(run_dir / "tensorboard");
//   tb.add_scalars(step, metrics_line);    // every number of a metrics.jsonl object
//   tb.add_text(step, "samples", markdown); // the TEXT tab
//   tb.flush();
//   auto events = rlx::read_tensorboard_events(tb.file());   // checks every CRC
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlx {

// CRC-32C (Castagnoli), and TFRecord's mask of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// False where rlx was built without protobuf (RLX_TENSORBOARD=OFF): the writer is then refused.
bool tensorboard_available();

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.<seconds>.<host>.<pid> file in it.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  // One event at `step` holding a scalar per number of `metrics` (a JSON object; nested
  // objects as "outer/inner"); strings, lists and non-finite numbers are skipped.
  void add_scalars(int64_t step, const nlohmann::json& metrics, double wall_time = -1);
  // One event at `step` holding `text` (markdown) under `tag`, for the text plugin.
  void add_text(int64_t step, const std::string& tag, const std::string& text, double wall_time = -1);
  void flush();
  const std::filesystem::path& file() const { return file_; }

 private:
  void write_record(const std::string& payload);
  std::filesystem::path file_;
  std::ofstream out_;
};

struct TensorBoardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                          // the first event's
  std::vector<std::pair<std::string, float>> scalars;  // tag, value
  std::vector<std::pair<std::string, std::string>> texts;  // tag, text (the text plugin's)
};

// Every event of a file. Throws rlx::Error naming the file and the byte offset of a record
// that is cut short, fails its CRC or does not parse.
std::vector<TensorBoardEvent> read_tensorboard_events(const std::filesystem::path& file);

}  // namespace rlx
