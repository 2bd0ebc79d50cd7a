// rlx inspect safetensors FILE    the validated header; exit 1 naming the problem
// rlx inspect tensorboard PATH    a TensorBoard events file (or a directory's), one JSON line per
//                                 event; exit 1 naming the byte offset of a corrupt record
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/tensorboard.hpp"
#include "rlx/model/safetensors.hpp"

namespace rlx::cli {

void add_inspect_commands(CLI::App& app, Action& action) {
  auto* inspect = app.add_subcommand("inspect", "Show and verify files rlx reads and writes");
  inspect->require_subcommand(1);
  auto file = std::make_shared<std::string>();
  auto* st = inspect->add_subcommand("safetensors", "Validate a safetensors file and print its header");
  st->add_option("file", *file, "safetensors file")->required();
  st->callback([file, &action] {
    action = [file] {
      auto f = SafetensorsFile::open(*file);
      const auto& h = f.header();
      uint64_t bytes = 0, elements = 0;
      for (const auto& [k, v] : h.metadata) std::cout << fmt::format("metadata {} = {}\n", k, v);
      for (const auto& e : h.entries) {
        uint64_t n = 1;
        for (auto d : e.shape) n *= static_cast<uint64_t>(d);
        elements += n;
        bytes += e.end - e.begin;
        std::cout << fmt::format("{:<60} {:<5} [{}] {} bytes\n", e.name, e.dtype, fmt::join(e.shape, ", "), e.end - e.begin);
      }
      std::cout << fmt::format("{} tensors, {} elements, {} data bytes, header {} bytes: valid\n", h.entries.size(),
                               elements, bytes, h.data_offset - 8);
      return 0;
    };
  });
  auto tb_path = std::make_shared<std::string>();
  auto* tb = inspect->add_subcommand("tensorboard", "Read and verify TensorBoard event files (every record's CRC)");
  tb->add_option("path", *tb_path, "an events.out.tfevents.* file, or a directory of them")->required();
  tb->callback([tb_path, &action] {
    action = [tb_path] {
      std::vector<std::filesystem::path> files;
      if (std::filesystem::is_directory(*tb_path)) {
        for (const auto& e : std::filesystem::directory_iterator(*tb_path))
          if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
        std::sort(files.begin(), files.end());
        RLX_CHECK(!files.empty(), "{}: no events.out.tfevents.* files", *tb_path);
      } else {
        files.push_back(*tb_path);
      }
      for (const auto& f : files)
        for (const auto& e : read_tensorboard_events(f)) {
          nlohmann::json line = {{"file", f.filename().string()}, {"step", e.step}, {"wall_time", e.wall_time}};
          if (!e.file_version.empty()) line["file_version"] = e.file_version;
          for (const auto& [tag, v] : e.scalars) line["scalars"][tag] = v;
          std::cout << line.dump() << "\n";
        }
      return 0;
    };
  });
}

}  // namespace rlx::cli
