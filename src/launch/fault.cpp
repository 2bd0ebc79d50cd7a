// Fault injection for the end-to-end tests (RLX_FAULT; role_common.hpp).
#include <cstdio>
#include <string_view>

#include "role_common.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

Fault Fault::from_env() {
  Fault f;
  const char* v = std::getenv("RLX_FAULT");
  if (v == nullptr || *v == 0) return f;
  const std::string_view text(v);
  char role[16] = {};
  bool ok = false;
  if (text.starts_with("slow-start:")) {
    ok = std::sscanf(v, "slow-start:%15[a-z]:%lf", role, &f.seconds) == 2 && f.seconds >= 0 && f.seconds <= 600;
    f.role = role;
  } else if (text.starts_with("slow-checkpoint:")) {
    ok = std::sscanf(v, "slow-checkpoint:%lf", &f.seconds) == 1 && f.seconds >= 0 && f.seconds <= 600;
  } else if (text.starts_with("kill-after-episode-checkpoint:")) {
    ok = std::sscanf(v, "kill-after-episode-checkpoint:%d:%lu", &f.worker, &f.count) == 2 && f.worker >= 0;
  }
  RLX_CHECK(ok, "RLX_FAULT={}: expected slow-start:ROLE:SECONDS, slow-checkpoint:SECONDS (0 to 600) or "
            "kill-after-episode-checkpoint:W:N", v);
  f.kind = std::string(text.substr(0, text.find(':')));
  return f;
}

bool Fault::fires(const fs::path& run_dir) const {
  const auto marker = run_dir / "fault-injected";
  if (kind.empty() || fs::exists(marker)) return false;
  write_file_atomic(marker, kind + "\n");
  return true;
}

}  // namespace rlx::launch
