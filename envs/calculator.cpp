// calculator: multi-turn tool use. Each turn the model either calls the tool,
//   <calc>123 * 45</calc>      -> the environment answers "<result>5535</result>\n"
// or answers,
//   Answer: 5468               -> scored (reward 1 for the exact value), done.
// More than `max_calls` calls (default 4) ends the episode with reward 0.
// Task: {"prompt": ..., "answer": N}; generated tasks are products and sums of 3-digit numbers.
#include "common.hpp"

namespace rlx::envs {

namespace {

class Calculator final : public TextEnv {
 public:
  using TextEnv::TextEnv;

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    answer_ = field<long long>(task, "answer", "calculator task");
    calls_ = 0;
    done_ = false;
    return encode(field<std::string>(task, "prompt", "calculator task"));
  }

  std::vector<std::string> stop_strings() const override { return {"</calc>"}; }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "calculator: step() after the episode ended");
    const std::string text = decode(action);
    env::StepResult r;
    const auto open = text.find("<calc>");
    const auto answer = text.find("Answer:");
    if (open != std::string::npos && (answer == std::string::npos || open < answer)) {
      if (++calls_ > option("max_calls", 4)) {
        done_ = r.done = true;
        r.info = {{"why", "too many tool calls"}};
        return r;
      }
      const auto close = text.find("</calc>", open);
      const std::string expr = text.substr(open + 6, close == std::string::npos ? std::string::npos : close - open - 6);
      std::string error;
      const auto v = Expression::eval(expr, nullptr, &error);
      const std::string reply = v ? (std::fabs(*v) < 1e15 && *v == std::floor(*v) ? fmt::format("{}", static_cast<long long>(*v))
                                                                                   : fmt::format("{:.6g}", *v))
                                  : "error: " + error;
      r.observation = encode("<result>" + reply + "</result>\n");
      r.info = {{"call", expr}, {"result", reply}};
      return r;
    }
    done_ = r.done = true;
    const auto got = last_integer(answer == std::string::npos ? text : text.substr(answer));
    r.reward = got && *got == answer_ ? 1.0 : 0.0;
    r.info = {{"answer", answer_}, {"parsed", got ? nlohmann::json(*got) : nlohmann::json(nullptr)}, {"calls", calls_}};
    return r;
  }

  std::string save_state() const override {
    return nlohmann::json{{"answer", answer_}, {"calls", calls_}, {"done", done_}}.dump();
  }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "calculator");
    answer_ = field<long long>(j, "answer", "calculator state");
    calls_ = field<int>(j, "calls", "calculator state");
    done_ = field<bool>(j, "done", "calculator state");
  }

 private:
  long long answer_ = 0;
  int calls_ = 0;
  bool done_ = false;
};

nlohmann::json generate_calculator_task(uint64_t seed, uint64_t index, const nlohmann::json&) {
  auto rng = task_rng(seed, index, "calculator");
  const auto a = rng.uniform_int(100, 999), b = rng.uniform_int(100, 999), c = rng.uniform_int(100, 999);
  const std::string expr = fmt::format("{} * {} - {}", a, b, c);
  return {{"prompt", fmt::format("What is {}? You may use the calculator: write <calc>EXPRESSION</calc> and wait for the "
                                 "<result>. Finish with 'Answer: N'.\n",
                                 expr)},
          {"answer", a * b - c}};
}

}  // namespace

void register_calculator(env::Registry& r) {
  r.add("calculator", "multi-turn tool use: <calc>EXPR</calc> answered with <result>V</result> (options: max_calls)",
        [](const env::Context& c) { return std::make_unique<Calculator>(c); }, generate_calculator_task);
}

}  // namespace rlx::envs
