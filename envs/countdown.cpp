// countdown: reach `target` with `numbers` (each at most once) and + - * /. One turn;
// the answer's first line that holds an expression is evaluated (anything after '=' is
// ignored); reward 1 for an exact hit using only the given numbers.
// Task: {"numbers": [...], "target": N, "prompt"?: ...}. Options: count (4), max (25).
#include <fmt/ranges.h>
#include <algorithm>

#include "common.hpp"

namespace rlx::envs {

namespace {

class Countdown final : public TextEnv {
 public:
  using TextEnv::TextEnv;

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    numbers_ = field<std::vector<long long>>(task, "numbers", "countdown task");
    target_ = field<long long>(task, "target", "countdown task");
    done_ = false;
    return encode(task.contains("prompt") ? field<std::string>(task, "prompt", "countdown task") : prompt(numbers_, target_));
  }

  static std::string prompt(const std::vector<long long>& numbers, long long target) {
    return fmt::format("Using the numbers [{}], each at most once, and + - * /, make {}. Write only the expression.\n",
                       fmt::join(numbers, ", "), target);
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "countdown: step() after the episode ended");
    done_ = true;
    env::StepResult r;
    r.done = true;
    std::string text = decode(action), why = "no expression";
    std::optional<double> value;
    std::vector<long long> used;
    for (size_t start = 0; start < text.size() && !value;) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(start, end - start);
      if (const auto eq = line.find('='); eq != std::string::npos) line.resize(eq);
      used.clear();
      if (line.find_first_of("0123456789") != std::string::npos) value = Expression::eval(line, &used, &why);
      start = end + 1;
    }
    bool numbers_ok = value.has_value();
    if (value) {
      auto pool = numbers_;
      for (long long u : used) {
        auto it = std::find(pool.begin(), pool.end(), u);
        if (it == pool.end()) {
          numbers_ok = false;
          why = fmt::format("{} is not one of the numbers (or is used twice)", u);
          break;
        }
        pool.erase(it);
      }
    }
    const bool hit = numbers_ok && std::fabs(*value - static_cast<double>(target_)) < 1e-9;
    r.reward = hit ? 1.0 : 0.0;
    r.info = {{"target", target_}, {"value", value ? nlohmann::json(*value) : nlohmann::json(nullptr)}};
    if (!hit) r.info["why"] = numbers_ok ? "wrong value" : why;
    return r;
  }

  std::string save_state() const override {
    return nlohmann::json{{"numbers", numbers_}, {"target", target_}, {"done", done_}}.dump();
  }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "countdown");
    numbers_ = field<std::vector<long long>>(j, "numbers", "countdown state");
    target_ = field<long long>(j, "target", "countdown state");
    done_ = field<bool>(j, "done", "countdown state");
  }

 private:
  std::vector<long long> numbers_;
  long long target_ = 0;
  bool done_ = false;
};

// Numbers, then a target made from a random expression over them (always solvable).
nlohmann::json generate_countdown_task(uint64_t seed, uint64_t index, const nlohmann::json& o) {
  const int count = o.value("count", 4), max = o.value("max", 25);
  RLX_CHECK(count >= 2 && count <= 6 && max >= 2 && max <= 1000, "countdown options: count in [2, 6], max in [2, 1000]");
  auto rng = task_rng(seed, index, "countdown");
  for (;;) {
    std::vector<long long> numbers;
    for (int i = 0; i < count; ++i) numbers.push_back(rng.uniform_int(1, max));
    std::string expr = std::to_string(numbers[0]);
    for (int i = 1; i < count; ++i) expr = fmt::format("({}) {} {}", expr, "+-*"[rng.uniform_int(0, 2)], numbers[static_cast<size_t>(i)]);
    const double v = *Expression::eval(expr);
    if (v < 1 || v > 10000 || v != std::floor(v)) continue;
    const auto target = static_cast<long long>(v);
    return {{"numbers", numbers}, {"target", target}, {"prompt", Countdown::prompt(numbers, target)}};
  }
}

}  // namespace

void register_countdown(env::Registry& r) {
  r.add("countdown", "reach a target with the given numbers and + - * / (options: count, max)",
        [](const env::Context& c) { return std::make_unique<Countdown>(c); }, generate_countdown_task);
}

}  // namespace rlx::envs
