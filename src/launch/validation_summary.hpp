// The validation part of a console line (internal to src/launch; the learner's line and the
// launcher's progress line): "  val acc 0.400 mean@8 0.350 pass@1 0.350 pass@8 0.600 maj@8 0.450"
// when a metrics line holds val/ keys, else "".
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

namespace rlx::launch {

inline std::string validation_summary(const nlohmann::json& line) {
  const auto acc = line.find("val/greedy_acc");
  if (acc == line.end() || !acc->is_number()) return {};
  std::string out = fmt::format("  val acc {:.3f}", acc->get<double>());
  for (const char* prefix : {"val/mean@", "val/pass@", "val/maj@"})
    for (const auto& [k, v] : line.items())
      if (k.starts_with(prefix) && v.is_number()) out += fmt::format(" {} {:.3f}", k.substr(4), v.get<double>());
  return out;
}

}  // namespace rlx::launch
