// arithmetic: "Compute 37 + 58 * 2." — one turn, reward 1 for the exact value (the last
// integer of the answer). Options: digits (per operand), terms, ops ("+-*").
// Task: {"prompt": ..., "answer": N} (from a dataset or the generator).
#include "common.hpp"

namespace rlx::envs {

namespace {

class Arithmetic final : public TextEnv {
 public:
  using TextEnv::TextEnv;

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    answer_ = field<long long>(task, "answer", "arithmetic task");
    done_ = false;
    return encode(field<std::string>(task, "prompt", "arithmetic task"));
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "arithmetic: step() after the episode ended");
    done_ = true;
    const auto got = last_integer(decode(action));
    env::StepResult r;
    r.done = true;
    r.reward = got && *got == answer_ ? 1.0 : 0.0;
    r.info = {{"answer", answer_}, {"parsed", got ? nlohmann::json(*got) : nlohmann::json(nullptr)}};
    return r;
  }

  std::vector<std::string> stop_strings() const override { return {"\n"}; }  // the answer's line ends the turn

  std::string save_state() const override { return nlohmann::json{{"answer", answer_}, {"done", done_}}.dump(); }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "arithmetic");
    answer_ = field<long long>(j, "answer", "arithmetic state");
    done_ = field<bool>(j, "done", "arithmetic state");
  }

 private:
  long long answer_ = 0;
  bool done_ = false;
};

nlohmann::json generate_arithmetic_task(uint64_t seed, uint64_t index, const nlohmann::json& o) {
  const int digits = o.value("digits", 2), terms = o.value("terms", 2);
  const std::string ops = o.value("ops", std::string("+-*"));
  RLX_CHECK(digits >= 1 && digits <= 6 && terms >= 2 && terms <= 8 && !ops.empty() &&
                ops.find_first_not_of("+-*") == std::string::npos,
            "arithmetic options: digits in [1, 6], terms in [2, 8], ops from \"+-*\"");
  auto rng = task_rng(seed, index, "arithmetic");
  const long long hi = static_cast<long long>(std::pow(10, digits)) - 1;
  std::string expr = std::to_string(rng.uniform_int(0, hi));
  for (int t = 1; t < terms; ++t) {
    const char op = ops[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(ops.size()) - 1))];
    expr += fmt::format(" {} {}", op, rng.uniform_int(0, hi));
  }
  const double v = *Expression::eval(expr);
  return {{"prompt", fmt::format("Compute {}. Give the final answer as a number.\n", expr)},
          {"answer", static_cast<long long>(v)}};
}

}  // namespace

void register_arithmetic(env::Registry& r) {
  r.add("arithmetic", "verifiable sums and products (options: digits, terms, ops)",
        [](const env::Context& c) { return std::make_unique<Arithmetic>(c); }, generate_arithmetic_task);
}

}  // namespace rlx::envs
