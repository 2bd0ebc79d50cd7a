// rlx inspect safetensors FILE   the validated header; exit 1 naming the problem
#include <fmt/ranges.h>

#include <iostream>

#include "commands.hpp"
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
}

}  // namespace rlx::cli
