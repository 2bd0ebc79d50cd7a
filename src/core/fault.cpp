#include "rlx/core/fault.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "rlx/core/error.hpp"
#include "rlx/core/files.hpp"

namespace rlx::fault {

namespace {

constexpr std::array<std::pair<Point, std::string_view>, 8> kNames = {{
    {Point::slow_start, "slow-start"},
    {Point::slow_checkpoint, "slow-checkpoint"},
    {Point::kill_after_episode_checkpoint, "kill-after-episode-checkpoint"},
    {Point::checkpoint_shards, "shards"},
    {Point::checkpoint_shards_agreed, "shards-agreed"},
    {Point::checkpoint_manifest, "manifest"},
    {Point::checkpoint_renamed, "renamed"},
    {Point::collective, "collective"},
}};

std::string variable(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The names of the points in [first, last], for an error.
std::string names(Point first, Point last) {
  std::string out;
  for (const auto& [p, n] : kNames)
    if (p >= first && p <= last) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

Point point_named(std::string_view name, Point first, Point last, const std::string& where) {
  for (const auto& [p, n] : kNames)
    if (n == name && p >= first && p <= last) return p;
  throw Error(fmt::format("{}: unknown fault point '{}' (known: {})", where, name, names(first, last)));
}

// `text` as a whole number (or nothing).
template <class T>
std::optional<T> number(std::string_view text) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// `text` split at its first `parts - 1` colons (the last part keeps any further colons).
std::vector<std::string_view> fields(std::string_view text, size_t parts) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const auto colon = text.find(':');
    if (colon == std::string_view::npos) break;
    out.push_back(text.substr(0, colon));
    text.remove_prefix(colon + 1);
  }
  out.push_back(text);
  return out;
}

Fault parse_fault(const std::string& value) {
  const std::string where = "RLX_FAULT=" + value;
  const auto colon = value.find(':');
  Fault f;
  f.point = point_named(std::string_view(value).substr(0, colon), Point::slow_start,
                        Point::kill_after_episode_checkpoint, where);
  const auto rest = colon == std::string::npos ? std::string_view() : std::string_view(value).substr(colon + 1);
  const auto seconds = [](std::string_view s) {
    auto v = number<double>(s);
    return v && *v >= 0 && *v <= 600 ? v : std::nullopt;
  };
  bool ok = false;
  if (f.point == Point::slow_start) {  // slow-start:ROLE:SECONDS, the role's index 0
    const auto p = fields(rest, 2);
    const auto s = p.size() == 2 ? seconds(p[1]) : std::nullopt;
    ok = s && !p[0].empty() && p[0].find_first_not_of("abcdefghijklmnopqrstuvwxyz") == std::string_view::npos;
    if (ok) f.role = std::string(p[0]), f.rank = 0, f.seconds = *s;
  } else if (f.point == Point::slow_checkpoint) {  // slow-checkpoint:SECONDS, rank 0
    const auto s = seconds(rest);
    ok = s.has_value();
    if (ok) f.rank = 0, f.seconds = *s;
  } else {  // kill-after-episode-checkpoint:W:N
    const auto p = fields(rest, 2);
    const auto w = number<int>(p[0]);
    const auto n = p.size() == 2 ? number<uint64_t>(p[1]) : std::nullopt;
    ok = w && *w >= 0 && n;
    if (ok) f.rank = *w, f.after = *n;
  }
  RLX_CHECK(
      ok,
      "{}: expected slow-start:ROLE:SECONDS, slow-checkpoint:SECONDS (0 to 600) or kill-after-episode-checkpoint:W:N",
      where);
  return f;
}

Fault parse_checkpoint_crash(const std::string& at) {
  Fault f;
  f.point = point_named(at, Point::checkpoint_shards, Point::checkpoint_renamed, "RLX_CHECKPOINT_CRASH_AT=" + at);
  f.rank = 0;
  if (const auto r = variable("RLX_CHECKPOINT_CRASH_RANK"); !r.empty()) {
    const auto v = number<int>(r);
    RLX_CHECK(v && *v >= 0, "RLX_CHECKPOINT_CRASH_RANK={}: expected a rank (0 or more)", r);
    f.rank = *v;
  }
  if (const auto s = variable("RLX_CHECKPOINT_CRASH_STEP"); !s.empty()) {
    const auto v = number<int64_t>(s);
    RLX_CHECK(v && *v >= 0, "RLX_CHECKPOINT_CRASH_STEP={}: expected a step (0 or more)", s);
    f.step = *v;
  }
  f.once_file = variable("RLX_CHECKPOINT_CRASH_ONCE");
  return f;
}

Fault parse_comm_crash(const std::string& value) {  // RANK:N:WHAT
  const auto p = fields(value, 3);
  Fault f;
  const auto rank = number<int>(p[0]);
  const uint64_t n = p.size() == 3 ? number<uint64_t>(p[1]).value_or(0) : 0;
  RLX_CHECK(rank && *rank >= 0 && n >= 1 && !p[2].empty(),
            "RLX_COMM_CRASH={}: expected RANK:N:WHAT (the N-th collective, from 1, whose description contains WHAT)",
            value);
  f.rank = *rank;
  f.nth = n;
  f.what = std::string(p[2]);
  f.once_file = variable("RLX_COMM_CRASH_ONCE");
  return f;
}

// The parsed faults, kept while the variables stay as they were, and the count of matches
// per point (Fault::nth).
struct State {
  std::mutex m;
  std::string key;
  bool parsed = false;
  std::vector<Fault> faults;
  std::map<Point, uint64_t> seen;

  void refresh() {
    std::string k;
    for (const char* v : kVariables) k += variable(v) + '\0';
    if (parsed && k == key) return;
    faults = from_env();
    seen.clear();
    key = std::move(k);
    parsed = true;
  }
};

State& state() {
  static State s;
  return s;
}

// True if `file` is empty, or did not exist and was created now.
bool claim(const std::filesystem::path& file, Point point) {
  if (file.empty()) return true;
  if (std::filesystem::exists(file)) return false;
  write_file_atomic(file, std::string(name(point)) + "\n");
  return true;
}

}  // namespace

std::string_view name(Point point) {
  for (const auto& [p, n] : kNames)
    if (p == point) return n;
  return "?";
}

std::vector<Fault> from_env() {
  std::vector<Fault> out;
  if (const auto v = variable("RLX_FAULT"); !v.empty()) out.push_back(parse_fault(v));
  if (const auto v = variable("RLX_CHECKPOINT_CRASH_AT"); !v.empty()) out.push_back(parse_checkpoint_crash(v));
  if (const auto v = variable("RLX_COMM_CRASH"); !v.empty()) out.push_back(parse_comm_crash(v));
  return out;
}

bool armed(Point point) {
  auto& s = state();
  std::lock_guard lock(s.m);
  s.refresh();
  for (const auto& f : s.faults)
    if (f.point == point) return true;
  return false;
}

std::optional<Fault> fires(Point point, const Site& site) {
  auto& s = state();
  std::lock_guard lock(s.m);
  s.refresh();
  for (const auto& f : s.faults) {
    if (f.point != point || (f.rank >= 0 && f.rank != site.rank) || (!f.role.empty() && f.role != site.role) ||
        (f.step >= 0 && f.step != site.step) || site.count < f.after)
      continue;
    if (!f.what.empty() && site.what.find(f.what) == std::string_view::npos) continue;
    if (f.nth > 0 && ++s.seen[point] != f.nth) continue;
    if (!claim(f.once_file.empty() ? site.once_file : std::filesystem::path(f.once_file), point)) continue;
    return f;
  }
  return std::nullopt;
}

void crash_at(Point point, const Site& site) {
  if (fires(point, site)) std::raise(SIGKILL);
}

}  // namespace rlx::fault
