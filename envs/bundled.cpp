#include "rlx/env/bundled.hpp"

#include "common.hpp"

namespace rlx::env {

void register_bundled(Registry& registry) {
  const std::pair<const char*, void (*)(Registry&)> all[] = {
      {"arithmetic", envs::register_arithmetic},     {"countdown", envs::register_countdown},
      {"calculator", envs::register_calculator},     {"python_code", envs::register_python_code},
      {"guess_number", envs::register_guess_number}, {"synthetic", envs::register_synthetic},
      {"agent_program", envs::register_agent_program}, {"math", envs::register_math}};
  for (auto [name, add] : all)
    if (!registry.has(name)) add(registry);
}

}  // namespace rlx::env
