// The roles of a run as a type: every process `rlx run` starts is one of these (its name is
// what `rlx role NAME` and the run directory's files spell).
//
//   rlx::launch::Role r = rlx::launch::parse_role("worker").value();   // Role::worker
//   rlx::launch::role_name(r);                                          // "worker"
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

namespace rlx::launch {

enum class Role : uint8_t { hub, learner, worker };

constexpr const char* role_name(Role r) {
  switch (r) {
    case Role::hub:
      return "hub";
    case Role::learner:
      return "learner";
    case Role::worker:
      return "worker";
  }
  return "?";
}

constexpr std::optional<Role> parse_role(std::string_view name) {
  for (Role r : {Role::hub, Role::learner, Role::worker})
    if (name == role_name(r)) return r;
  return std::nullopt;
}

}  // namespace rlx::launch
