// Shared pieces of the bundled environments: text helpers, a bounded arithmetic
// expression evaluator, and a base for environments that talk in text.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlx/core/config.hpp"
#include "rlx/core/error.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/log.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/env/env.hpp"

namespace rlx::envs {

// Refuses a key of `options` (an environment's env.options) that is not in `known`, naming
// it and the closest known name.
inline void check_option_names(std::string_view env, const nlohmann::json& options, const std::vector<std::string>& known) {
  for (const auto& [key, value] : options.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const auto guess = config::closest(key, known);
    throw Error(fmt::format("{}: unknown option env.options.{}{}", env, key,
                            guess.empty() ? "" : fmt::format("; did you mean '{}'?", guess)));
  }
}

// env.options.strict: whether a bad line of a task file is an error (true) or skipped (false).
inline bool strict_option(std::string_view env, const nlohmann::json& options, bool fallback) {
  if (!options.contains("strict")) return fallback;
  RLX_CHECK(options.at("strict").is_boolean(), "{} option 'strict': expected true or false", env);
  return options.at("strict").get<bool>();
}

// A JSONL file of tasks (env.options.data): one JSON object a line, blank lines ignored.
struct TaskFile {
  std::vector<nlohmann::json> tasks;
  size_t skipped = 0;  // bad lines left out (never with `strict`)
};

// The longest line of a task file: a record past it is named, never read whole into a task.
inline constexpr size_t kMaxTaskLineBytes = size_t{16} << 20;

// Reads `path` once per process and again when the file changes (its size and time are part
// of the cache key, with `variant`: whatever else changes how a line is read). `check` throws
// rlx::Error for a line that is JSON but not a task of `env`. A bad line is named with its file
// and line: an error with `strict`, else skipped, counted and logged (the first ten).
inline std::shared_ptr<const TaskFile> read_task_file(
    std::string_view env, const std::string& path, bool strict, const std::string& variant,
    const std::function<void(const nlohmann::json& task, const std::string& where)>& check) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const TaskFile>> cache;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto time = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  const std::string key = fmt::format("{}\n{}\n{}\n{}\n{}\n{}", env, path, variant, strict, size, time);
  std::lock_guard lock(mu);
  auto& slot = cache[key];
  if (slot) return slot;
  std::ifstream in(path, std::ios::binary);
  RLX_CHECK(in.good(), "{} option 'data': cannot read {}", env, path);
  auto file = std::make_shared<TaskFile>();
  size_t lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, lineno);
    try {
      RLX_CHECK(line.size() <= kMaxTaskLineBytes, "{}: a record longer than {} bytes", where, kMaxTaskLineBytes);
      nlohmann::json task = parse_json(line, where);
      check(task, where);
      file->tasks.push_back(std::move(task));
    } catch (const Error& e) {
      if (strict) throw Error(fmt::format("{} (env.options.strict: false skips such lines)", e.what()));
      if (++file->skipped <= 10) log::warn("{}: skipped {}", env, e.what());
    }
  }
  if (file->skipped > 0)
    log::warn("{}: {}: skipped {} of {} lines (env.options.strict: true makes a bad line an error)", env, path,
              file->skipped, lineno);
  RLX_CHECK(!file->tasks.empty(), "{}: {} has no usable task ({} lines)", env, path, lineno);
  slot = std::move(file);
  return slot;
}

// The last integer written in `text` ("... so the answer is -42." -> -42), if any.
inline std::optional<long long> last_integer(std::string_view text) {
  std::optional<long long> out;
  for (size_t i = 0; i < text.size();) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j - i <= 18) {
      long long v = std::stoll(std::string(text.substr(i, j - i)));
      if (i > 0 && text[i - 1] == '-') v = -v;
      out = v;
    }
    i = j;
  }
  return out;
}

// Evaluates + - * / and parentheses over non-negative integer literals (unary minus
// allowed), in double precision. Bounded: 256 characters, nesting 32. Records the literals
// used (countdown checks them). Returns nullopt and sets `error` on anything else.
class Expression {
 public:
  static std::optional<double> eval(std::string_view text, std::vector<long long>* literals = nullptr,
                                    std::string* error = nullptr) {
    Expression e(text, literals);
    if (text.size() > 256) return e.fail(error, "longer than 256 characters");
    try {
      const double v = e.sum(0);
      e.skip();
      if (e.pos_ != text.size()) return e.fail(error, fmt::format("unexpected '{}' at {}", text[e.pos_], e.pos_));
      if (!std::isfinite(v)) return e.fail(error, "division by zero");
      return v;
    } catch (const std::string& why) {
      return e.fail(error, why);
    }
  }

 private:
  Expression(std::string_view t, std::vector<long long>* lits) : t_(t), lits_(lits) {}
  std::optional<double> fail(std::string* error, std::string why) {
    if (error) *error = std::move(why);
    return std::nullopt;
  }
  void skip() {
    while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
  }
  double sum(int depth) {
    double v = product(depth);
    for (;;) {
      skip();
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) {
        const char op = t_[pos_++];
        const double r = product(depth);
        v = op == '+' ? v + r : v - r;
      } else {
        return v;
      }
    }
  }
  double product(int depth) {
    double v = unary(depth);
    for (;;) {
      skip();
      if (pos_ < t_.size() && (t_[pos_] == '*' || t_[pos_] == '/' || t_[pos_] == 'x')) {
        const char op = t_[pos_++];
        const double r = unary(depth);
        if (op == '/' && r == 0) throw std::string("division by zero");
        v = op == '/' ? v / r : v * r;
      } else {
        return v;
      }
    }
  }
  double unary(int depth) {
    skip();
    if (pos_ < t_.size() && t_[pos_] == '-') {
      ++pos_;
      return -unary(depth);
    }
    return atom(depth);
  }
  double atom(int depth) {
    skip();
    if (pos_ >= t_.size()) throw std::string("the expression ends early");
    if (t_[pos_] == '(') {
      if (depth >= 32) throw std::string("nested deeper than 32");
      ++pos_;
      const double v = sum(depth + 1);
      skip();
      if (pos_ >= t_.size() || t_[pos_] != ')') throw std::string("a '(' is not closed");
      ++pos_;
      return v;
    }
    const size_t start = pos_;
    while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    if (pos_ == start) throw fmt::format("expected a number at {}", start);
    if (pos_ - start > 15) throw std::string("a number longer than 15 digits");
    const long long n = std::stoll(std::string(t_.substr(start, pos_ - start)));
    if (lits_) lits_->push_back(n);
    return static_cast<double>(n);
  }

  std::string_view t_;
  size_t pos_ = 0;
  std::vector<long long>* lits_;
};

// An environment that speaks text: observations are encoded once, here; actions are
// decoded only to be scored.
class TextEnv : public env::Env {
 public:
  explicit TextEnv(const env::Context& c) : ctx_(c) {}

 protected:
  std::vector<TokenId> encode(std::string_view text) const { return ctx_.tokenizer->encode(text); }
  std::string decode(std::span<const TokenId> ids) const { return ctx_.tokenizer->decode(ids, /*skip_special=*/true); }
  template <class T>
  T option(const char* key, T fallback) const {
    if (!ctx_.options.contains(key)) return fallback;
    try {
      return ctx_.options.at(key).get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("environment option '{}': {}", key, e.what()));
    }
  }
  static nlohmann::json parse_state(std::string_view state, const char* env_name) {
    try {
      return nlohmann::json::parse(state);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: saved state is not JSON: {}", env_name, e.what()));
    }
  }
  template <class T>
  static T field(const nlohmann::json& j, const char* key, const char* what) {
    try {
      return j.at(key).get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: field '{}': {}", what, key, e.what()));
    }
  }
  env::Context ctx_;
};

// The task stream of a generator: an independent random stream per (seed, index).
inline RngStream task_rng(uint64_t seed, uint64_t index, std::string_view env) {
  return RngStream(seed, index).fork(env);
}

void register_arithmetic(env::Registry& r);
void register_countdown(env::Registry& r);
void register_calculator(env::Registry& r);
void register_python_code(env::Registry& r);
void register_guess_number(env::Registry& r);
void register_synthetic(env::Registry& r);
void register_agent_program(env::Registry& r);
void register_math(env::Registry& r);

}  // namespace rlx::envs
