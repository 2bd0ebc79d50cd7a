#include "rlx/core/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace rlx::config {

void BoundsChecker::fail(std::string_view key, const std::string& value, const Bounds& bounds) const {
  throw Error(fmt::format("{}: {}{} = {} is not {}", who_, prefix_, key, value, describe(bounds)));
}

std::string describe(const Bounds& b) {
  auto num = [](double v) { return fmt::format("{}", v); };
  if (b.min && b.max)
    return fmt::format("in {}{}, {}{}", b.min_exclusive ? "(" : "[", num(*b.min), num(*b.max), b.max_exclusive ? ")" : "]");
  if (b.min) return fmt::format("{} {}", b.min_exclusive ? ">" : ">=", num(*b.min));
  if (b.max) return fmt::format("{} {}", b.max_exclusive ? "<" : "<=", num(*b.max));
  return "any";
}

bool within(double v, const Bounds& b) {
  if (!std::isfinite(v)) return false;
  if (b.min && (b.min_exclusive ? !(v > *b.min) : !(v >= *b.min))) return false;
  if (b.max && (b.max_exclusive ? !(v < *b.max) : !(v <= *b.max))) return false;
  return true;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest(std::string_view key, std::span<const std::string> candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 3) + 1;  // beyond this a guess is noise
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string Origin::where(const YAML::Node& node, std::string_view path) const {
  // An override's value was parsed from its own text: its mark says line 1 of nothing.
  for (const auto& o : overridden)
    if (!path.empty() && (path == o || (path.starts_with(o) && (path[o.size()] == '.' || path[o.size()] == '['))))
      return "command line";
  YAML::Mark m = node.Mark();
  if (m.is_null() || m.line < 0) return "command line";
  if (file.empty()) return fmt::format("line {}", m.line + 1);
  return fmt::format("{}:{}", file, m.line + 1);
}

std::string Reader::kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return fmt::format("'{}'", n.Scalar());
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "nothing";
  }
}

void Reader::fail(const YAML::Node& n, const std::string& path, const std::string& what) {
  errors_.push_back(fmt::format("{} ({}): {}", path.empty() ? "<top level>" : path, origin_.where(n, path), what));
}

void Reader::check_bounds(const YAML::Node& n, const std::string& path, double v, const Bounds& b) {
  if (!within(v, b)) fail(n, path, fmt::format("{} is out of range: must be {}", n.Scalar(), describe(b)));
}

void Reader::finish() {
  if (!node_.IsMap()) return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) continue;
    std::string guess = closest(key, seen_);
    errors_.push_back(fmt::format("{} ({}): unknown key{}", join(key), origin_.where(it->first, join(key)),
                                  guess.empty() ? "" : fmt::format("; did you mean '{}'?", join(guess))));
  }
}

std::string Writer::format_number(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  // Keep it a float in YAML's eyes ("1" would read back as an integer, which is fine
  // for us, but "1.0" says what the field is).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

YAML::Node parse_string(std::string_view text, std::string_view source_name) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}:{}: invalid YAML: {}", source_name, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

YAML::Node parse_file(const std::filesystem::path& file) {
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (ec || !std::filesystem::exists(status)) throw ConfigError(fmt::format("cannot read config file {}: no such file", file.string()));
  // A directory reads as an empty file (all defaults) and /dev/zero never ends: neither is a config.
  if (!std::filesystem::is_regular_file(status))
    throw ConfigError(fmt::format("cannot read config file {}: it is {}, not a file", file.string(),
                                  std::filesystem::is_directory(status) ? "a directory" : "a device, pipe or socket"));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("cannot read config file {}", file.string()));
  constexpr size_t kMaxConfigBytes = 16 << 20;
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError(fmt::format("config file {} is larger than {} bytes", file.string(), kMaxConfigBytes));
  return parse_string(text, file.string());
}

namespace {
void collect_changes(const YAML::Node& a, const YAML::Node& b, const std::string& path, std::vector<std::string>& out) {
  if (a.IsMap() && b.IsMap()) {
    std::vector<std::string> seen;
    for (const auto& kv : a) {
      const auto key = kv.first.as<std::string>();
      seen.push_back(key);
      collect_changes(kv.second, b[key], path.empty() ? key : path + "." + key, out);
    }
    for (const auto& kv : b)
      if (const auto key = kv.first.as<std::string>(); std::find(seen.begin(), seen.end(), key) == seen.end())
        out.push_back(path.empty() ? key : path + "." + key);
    return;
  }
  if (a.IsDefined() != b.IsDefined() || YAML::Dump(a) != YAML::Dump(b)) out.push_back(path);
}
}  // namespace

std::vector<std::string> changed_keys(const YAML::Node& a, const YAML::Node& b) {
  std::vector<std::string> out;
  collect_changes(a, b, "", out);
  return out;
}

std::vector<std::string> override_paths(std::span<const std::string> overrides) {
  std::vector<std::string> out;
  for (const auto& o : overrides)
    if (const auto eq = o.find('='); eq != std::string::npos) out.push_back(o.substr(0, eq));
  return out;
}

void apply_overrides(YAML::Node& root, std::span<const std::string> overrides) {
  for (const std::string& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(fmt::format("override '{}' (command line): expected section.key=value", o));
    std::string path = o.substr(0, eq), text = o.substr(eq + 1);
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      auto dot = path.find('.', start);
      parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    for (const auto& p : parts)
      if (p.empty()) throw ConfigError(fmt::format("override '{}' (command line): empty key in '{}'", o, path));
    // "key=" is the empty string (clearing a path), "key=null" or "key=~" is null.
    YAML::Node value;
    try {
      value = YAML::Load(text);
    } catch (const YAML::Exception&) {
      value = YAML::Node(text);
    }
    if (value.IsNull() && text != "null" && text != "~") value = YAML::Node(text);
    if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) throw ConfigError(fmt::format("override '{}': the config's top level is not a map", o));
    YAML::Node cur = root;
    std::string walked;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      walked += (i ? "." : "") + parts[i];
      YAML::Node next = cur[parts[i]];
      if (!next.IsDefined() || next.IsNull()) {
        cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
        next = cur[parts[i]];
      } else if (!next.IsMap()) {
        throw ConfigError(fmt::format("override '{}' (command line): {} is a value, not a section", o, walked));
      }
      cur.reset(next);
    }
    cur[parts.back()] = value;
  }
}

void throw_errors(const std::vector<std::string>& errors) {
  std::string msg = errors.size() == 1 ? "config error: " : fmt::format("{} config errors:", errors.size());
  for (size_t i = 0; i < errors.size(); ++i) msg += (errors.size() == 1 ? "" : "\n  ") + errors[i];
  throw ConfigError(msg);
}

std::string to_markdown(const std::vector<FieldDoc>& fields) {
  auto esc = [](std::string s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string out = "| key | type | default | allowed | meaning |\n| --- | --- | --- | --- | --- |\n";
  for (const auto& f : fields) {
    if (f.type == "section") {
      out += fmt::format("| **`{}`** | section | | | {} |\n", f.key, esc(f.doc));
      continue;
    }
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", f.key, esc(f.type), esc(f.default_value), esc(f.range),
                       esc(f.doc));
  }
  return out;
}

}  // namespace rlx::config
