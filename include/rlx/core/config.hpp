// Typed configuration: YAML files mapped onto option structs with defaults.
//
// An options struct lists its fields once, in a `visit` member; reading, writing
// back as YAML and documenting all use that list:
//
//   struct Sampling {
//     double temperature = 1.0;  // softmax temperature
//     int max_tokens = 256;      // new tokens per request
//     template <class V> void visit(V& v) {
//       v("temperature", temperature, "softmax temperature", config::greater_than(0));
//       v("max_tokens", max_tokens, "new tokens per request", config::at_least(1));
//     }
//   };
//   auto s = rlx::config::load_file<Sampling>("run.yaml", {"temperature=0.7"});
//   std::cout << rlx::config::to_yaml(s);
//
// Errors (all of them, not just the first) are collected and thrown as one
// rlx::ConfigError whose lines each name the full key path and, for files, the
// line: unknown keys (with the closest valid key suggested), wrong types,
// out-of-range values, and whatever a struct's optional `validate()` rejects.
// Enums map to names through an ADL `enum_names(E)` returning pairs.
#pragma once

#include <yaml-cpp/yaml.h>

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rlx/core/error.hpp"

namespace rlx::config {

// Allowed range of a numeric field.
struct Bounds {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
};
inline Bounds at_least(double v) { return {.min = v}; }
inline Bounds greater_than(double v) { return {.min = v, .min_exclusive = true}; }
inline Bounds in_range(double lo, double hi) { return {.min = lo, .max = hi}; }
// (lo, hi]
inline Bounds in_half_open(double lo, double hi) { return {.min = lo, .max = hi, .min_exclusive = true}; }
// A timeout or an interval: a millisecond to 30 days. A value a clock cannot act on
// (1e-300 s, .inf) is a typo, not a setting.
inline Bounds seconds() { return in_range(1e-3, 30 * 86400.0); }
// The same, where 0 turns the timer off.
inline Bounds seconds_or_zero() { return in_range(0, 30 * 86400.0); }

// Describes a Bounds as text: ">= 1", "in (0, 1]".
std::string describe(const Bounds& b);
// Whether v satisfies b. NaN and infinities never do: no field means "unbounded" by .inf.
bool within(double v, const Bounds& b);

// Edit distance, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The closest candidate within a small distance, or empty.
std::string closest(std::string_view key, std::span<const std::string> candidates);

// --- traits -----------------------------------------------------------------------
template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { enum_names(e) };
};

template <class E>
  requires NamedEnum<E>
std::string_view enum_to_string(E value) {
  for (const auto& [v, name] : enum_names(E{}))
    if (v == value) return name;
  RLX_ASSERT(false, "enum value {} has no name", static_cast<long long>(value));
  return {};
}

template <class E>
  requires NamedEnum<E>
std::optional<E> enum_from_string(std::string_view name) {
  for (const auto& [v, n] : enum_names(E{}))
    if (n == name) return v;
  return std::nullopt;
}

template <class E>
  requires NamedEnum<E>
std::vector<std::string> enum_name_list() {
  std::vector<std::string> out;
  for (const auto& [v, n] : enum_names(E{})) out.emplace_back(n);
  return out;
}

// The enum named `name`, or a ConfigError naming `what`, the value and the valid names.
template <class E>
  requires NamedEnum<E>
E parse_enum(std::string_view name, std::string_view what) {
  if (auto e = enum_from_string<E>(name)) return *e;
  std::string names;
  for (const auto& n : enum_name_list<E>()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(fmt::format("{} {:?} is not one of {}", what, name, names));
}

// A visitor that does nothing; used to detect visitable structs.
struct NullVisitor {
  template <class T>
  void operator()(std::string_view, T&, std::string_view, Bounds = {}) {}
};
template <class T>
concept Section = std::is_class_v<T> && requires(T& t, NullVisitor& v) { t.visit(v); };

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_string_map : std::false_type {};
template <class T>
struct is_string_map<std::map<std::string, T>> : std::true_type {};

// Human-readable type names for errors and docs.
template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "integer";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (NamedEnum<T>) {
    std::string s = "one of ";
    auto names = enum_name_list<T>();
    for (size_t i = 0; i < names.size(); ++i) s += (i ? "|" : "") + names[i];
    return s;
  } else if constexpr (is_vector<T>::value) return "list of " + type_name<typename T::value_type>();
  else if constexpr (is_optional<T>::value) return type_name<typename T::value_type>() + " or null";
  else if constexpr (is_string_map<T>::value) return "map of " + type_name<typename T::mapped_type>();
  else if constexpr (Section<T>) return "section";
  else static_assert(sizeof(T) == 0, "unsupported config field type");
}

// --- reading ------------------------------------------------------------------------
// Where a node came from, for messages: "run.yaml:12" or "command line".
struct Origin {
  std::string file;  // empty: no file
  std::vector<std::string> overridden;  // key paths set by key=value overrides
  // Where `node` (at key path `path`) came from.
  std::string where(const YAML::Node& node, std::string_view path = {}) const;
};

class Reader {
 public:
  Reader(const YAML::Node& node, std::string path, const Origin& origin, std::vector<std::string>& errors)
      : node_(node), path_(std::move(path)), origin_(origin), errors_(errors) {}

  template <class T>
  void operator()(std::string_view key, T& value, std::string_view doc, Bounds bounds = {}) {
    seen_.emplace_back(key);
    if (!node_.IsMap()) return;
    YAML::Node child = node_[std::string(key)];
    if (!child.IsDefined()) return;  // keep the default
    read_value(child, join(key), value, bounds);
  }

  // Reports keys present in the node that no field claimed.
  void finish();

  template <class T>
  void read_value(const YAML::Node& n, const std::string& path, T& value, const Bounds& bounds) {
    if constexpr (is_optional<T>::value) {
      if (n.IsNull()) {
        value.reset();
        return;
      }
      typename T::value_type inner = value.value_or(typename T::value_type{});
      size_t before = errors_.size();
      read_value(n, path, inner, bounds);
      if (errors_.size() == before) value = std::move(inner);
    } else if constexpr (Section<T>) {
      if (!n.IsMap()) return fail(n, path, fmt::format("expected a section (a map of keys), got {}", kind(n)));
      Reader sub(n, path, origin_, errors_);
      value.visit(sub);
      sub.finish();
      if constexpr (requires { value.validate(); }) {
        try {
          value.validate();
        } catch (const Error& e) {
          fail(n, path, e.what());
        }
      }
    } else if constexpr (is_vector<T>::value) {
      if (!n.IsSequence()) return fail(n, path, fmt::format("expected a list, got {}", kind(n)));
      T out;
      out.resize(n.size());
      for (size_t i = 0; i < n.size(); ++i) read_value(n[i], fmt::format("{}[{}]", path, i), out[i], bounds);
      value = std::move(out);
    } else if constexpr (is_string_map<T>::value) {
      if (!n.IsMap()) return fail(n, path, fmt::format("expected a map, got {}", kind(n)));
      T out;
      for (auto it = n.begin(); it != n.end(); ++it) {
        auto k = it->first.Scalar();
        read_value(it->second, path + "." + k, out[k], bounds);
      }
      value = std::move(out);
    } else {
      read_scalar(n, path, value, bounds);
    }
  }

 private:
  std::string join(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }
  static std::string kind(const YAML::Node& n);
  void fail(const YAML::Node& n, const std::string& path, const std::string& what);
  void check_bounds(const YAML::Node& n, const std::string& path, double v, const Bounds& b);

  template <class T>
  void read_scalar(const YAML::Node& n, const std::string& path, T& value, const Bounds& bounds) {
    if (!n.IsScalar()) return fail(n, path, fmt::format("expected {}, got {}", type_name<T>(), kind(n)));
    const std::string& text = n.Scalar();
    if constexpr (std::is_same_v<T, std::string>) {
      value = text;
    } else if constexpr (std::is_same_v<T, bool>) {
      bool b;
      if (!YAML::convert<bool>::decode(n, b)) return fail(n, path, fmt::format("expected true or false, got '{}'", text));
      value = b;
    } else if constexpr (std::is_integral_v<T>) {
      long long v;
      if (!YAML::convert<long long>::decode(n, v)) return fail(n, path, fmt::format("expected an integer, got '{}'", text));
      if (!within(static_cast<double>(v), bounds)) return check_bounds(n, path, static_cast<double>(v), bounds);
      if (!std::in_range<T>(v))
        return fail(n, path, fmt::format("{} does not fit in this field's integer type", text));
      value = static_cast<T>(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      double v;
      if (!YAML::convert<double>::decode(n, v)) return fail(n, path, fmt::format("expected a number, got '{}'", text));
      check_bounds(n, path, v, bounds);
      value = static_cast<T>(v);
    } else if constexpr (NamedEnum<T>) {
      if (auto e = enum_from_string<T>(text)) {
        value = *e;
      } else {
        auto names = enum_name_list<T>();
        auto guess = closest(text, names);
        fail(n, path, fmt::format("'{}' is not {}{}", text, type_name<T>(),
                                  guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
      }
    } else {
      static_assert(sizeof(T) == 0, "unsupported config field type");
    }
  }

  YAML::Node node_;
  std::string path_;
  const Origin& origin_;
  std::vector<std::string>& errors_;
  std::vector<std::string> seen_;
};

// --- writing --------------------------------------------------------------------------
class Writer {
 public:
  explicit Writer(YAML::Emitter& out) : out_(out) {}
  template <class T>
  void operator()(std::string_view key, T& value, std::string_view, Bounds = {}) {
    out_ << YAML::Key << std::string(key) << YAML::Value;
    write_value(value);
  }
  template <class T>
  void write_value(const T& value) {
    if constexpr (is_optional<T>::value) {
      if (value) write_value(*value);
      else out_ << YAML::Null;
    } else if constexpr (Section<T>) {
      out_ << YAML::BeginMap;
      const_cast<T&>(value).visit(*this);  // visit is non-const by design; Writer never mutates
      out_ << YAML::EndMap;
    } else if constexpr (is_vector<T>::value) {
      out_ << YAML::Flow << YAML::BeginSeq;
      for (const auto& v : value) write_value(v);
      out_ << YAML::EndSeq;
    } else if constexpr (is_string_map<T>::value) {
      out_ << YAML::BeginMap;
      for (const auto& [k, v] : value) {
        out_ << YAML::Key << k << YAML::Value;
        write_value(v);
      }
      out_ << YAML::EndMap;
    } else if constexpr (NamedEnum<T>) {
      out_ << std::string(enum_to_string(value));
    } else if constexpr (std::is_same_v<T, bool>) {
      out_ << (value ? "true" : "false");
    } else if constexpr (std::is_floating_point_v<T>) {
      out_ << format_number(static_cast<double>(value));
    } else if constexpr (std::is_integral_v<T>) {
      out_ << static_cast<long long>(value);
    } else {
      out_ << value;
    }
  }
  // Shortest text that reads back to the same double.
  static std::string format_number(double v);

 private:
  YAML::Emitter& out_;
};

// --- documenting ----------------------------------------------------------------------
struct FieldDoc {
  std::string key, type, default_value, range, doc;
};
class Documenter {
 public:
  Documenter(std::string path, std::vector<FieldDoc>& out) : path_(std::move(path)), out_(out) {}
  template <class T>
  void operator()(std::string_view key, T& value, std::string_view doc, Bounds bounds = {}) {
    std::string path = path_.empty() ? std::string(key) : path_ + "." + std::string(key);
    if constexpr (Section<T>) {
      out_.push_back({path, "section", "", "", std::string(doc)});
      Documenter sub(path, out_);
      value.visit(sub);
    } else {
      YAML::Emitter e;
      e << YAML::Flow;
      Writer(e).write_value(value);
      out_.push_back({path, type_name<T>(), e.c_str(),
                      bounds.min || bounds.max ? describe(bounds) : "", std::string(doc)});
    }
  }

 private:
  std::string path_;
  std::vector<FieldDoc>& out_;
};

// --- entry points ---------------------------------------------------------------------
// Parses a YAML file (a regular file of at most 16 MB, read no further); a syntax error
// becomes a ConfigError naming file, line and column.
YAML::Node parse_file(const std::filesystem::path& file);
YAML::Node parse_string(std::string_view text, std::string_view source_name);

// Applies "section.key=value" overrides onto the tree. The value is read as YAML
// ("3", "true", "[1, 2]"), falling back to a plain string. Throws ConfigError for
// a malformed override or a path through a non-section.
void apply_overrides(YAML::Node& root, std::span<const std::string> overrides);

[[noreturn]] void throw_errors(const std::vector<std::string>& errors);

// Reads a struct from a tree; throws one ConfigError listing every problem.
template <Section T>
T from_yaml(const YAML::Node& root, const Origin& origin, T value = T{}) {
  std::vector<std::string> errors;
  Reader top(YAML::Node(), "", origin, errors);
  if (root.IsNull() || !root.IsDefined()) return value;  // an empty file: all defaults
  top.read_value(root, "", value, {});
  if (!errors.empty()) throw_errors(errors);
  return value;
}

// The key paths that "section.key=value" overrides set, for Origin::overridden.
std::vector<std::string> override_paths(std::span<const std::string> overrides);

template <Section T>
T load_file(const std::filesystem::path& file, std::span<const std::string> overrides = {}) {
  YAML::Node root = parse_file(file);
  apply_overrides(root, overrides);
  return from_yaml<T>(root, Origin{file.string(), override_paths(overrides)});
}

template <Section T>
T load_string(std::string_view text, std::span<const std::string> overrides = {},
              std::string_view source_name = "<string>") {
  YAML::Node root = parse_string(text, source_name);
  apply_overrides(root, overrides);
  return from_yaml<T>(root, Origin{std::string(source_name), override_paths(overrides)});
}

template <Section T>
std::string to_yaml(const T& value) {
  YAML::Emitter out;
  Writer(out).write_value(value);
  return std::string(out.c_str()) + "\n";
}

// The full key paths ("rollout.workers", "env.options.digits") whose values differ
// between two configs of one type, in the first one's order (a list is one value).
std::vector<std::string> changed_keys(const YAML::Node& a, const YAML::Node& b);
template <Section T>
std::vector<std::string> changed_keys(const T& a, const T& b) {
  return changed_keys(YAML::Load(to_yaml(a)), YAML::Load(to_yaml(b)));
}

template <Section T>
std::vector<FieldDoc> document(const T& value = T{}) {
  std::vector<FieldDoc> out;
  Documenter d("", out);
  const_cast<T&>(value).visit(d);
  return out;
}

// Checks the numeric fields of a struct built in code (not read from YAML) against
// their declared bounds; throws rlx::Error "<who>: <key> = <value> is not <bounds>"
// for the first one outside.
class BoundsChecker {
 public:
  BoundsChecker(std::string_view who, std::string prefix = "") : who_(who), prefix_(std::move(prefix)) {}
  template <class T>
  void operator()(std::string_view key, T& value, std::string_view, Bounds bounds = {}) {
    if constexpr (Section<T>) {
      BoundsChecker inner(who_, prefix_ + std::string(key) + ".");
      value.visit(inner);
    } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (!within(static_cast<double>(value), bounds)) fail(key, fmt::format("{}", value), bounds);
    }
  }

 private:
  [[noreturn]] void fail(std::string_view key, const std::string& value, const Bounds& bounds) const;
  std::string_view who_;
  std::string prefix_;
};

template <Section T>
void check_bounds(const T& value, std::string_view who) {
  BoundsChecker c(who);
  const_cast<T&>(value).visit(c);
}

// A markdown table of `document()`'s rows.
std::string to_markdown(const std::vector<FieldDoc>& fields);

}  // namespace rlx::config
