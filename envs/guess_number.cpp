// guess_number: long horizon. A hidden number in [1, range]; each turn the model guesses
// (the last integer of its action) and hears "Higher.", "Lower." or "Correct!". Reward 1
// when found within `max_turns` (default 20); the state (target, every guess) is what a
// checkpoint carries, so an episode resumes mid-way in another process.
// Task: {"target": N, "range": R}; generated: range from options (default 1000).
#include "common.hpp"

namespace rlx::envs {

namespace {

class GuessNumber final : public TextEnv {
 public:
  using TextEnv::TextEnv;

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    target_ = field<long long>(task, "target", "guess_number task");
    range_ = task.value("range", 1000LL);
    RLX_CHECK(range_ >= 1 && target_ >= 1 && target_ <= range_, "guess_number task: target {} outside [1, {}]", target_, range_);
    guesses_.clear();
    done_ = false;
    return encode(fmt::format("I am thinking of a number between 1 and {}. Guess it; after each guess I say Higher. or "
                              "Lower.\nGuess: ",
                              range_));
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "guess_number: step() after the episode ended");
    env::StepResult r;
    const auto g = last_integer(decode(action));
    guesses_.push_back(g ? *g : 0);
    if (g && *g == target_) {
      done_ = r.done = true;
      r.reward = 1.0;
      r.info = {{"found_after", guesses_.size()}};
      return r;
    }
    if (static_cast<int>(guesses_.size()) >= option("max_turns", 20)) {
      done_ = r.done = true;
      r.info = {{"why", "out of turns"}};
      return r;
    }
    r.observation = encode(!g ? "Say a number.\nGuess: " : *g < target_ ? "Higher.\nGuess: " : "Lower.\nGuess: ");
    r.info = {{"guess", g ? nlohmann::json(*g) : nlohmann::json(nullptr)}};
    return r;
  }

  std::string save_state() const override {
    return nlohmann::json{{"target", target_}, {"range", range_}, {"guesses", guesses_}, {"done", done_}}.dump();
  }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "guess_number");
    target_ = field<long long>(j, "target", "guess_number state");
    range_ = field<long long>(j, "range", "guess_number state");
    guesses_ = field<std::vector<long long>>(j, "guesses", "guess_number state");
    done_ = field<bool>(j, "done", "guess_number state");
  }

 private:
  long long target_ = 0, range_ = 1000;
  std::vector<long long> guesses_;
  bool done_ = false;
};

nlohmann::json generate_guess_number_task(uint64_t seed, uint64_t index, const nlohmann::json& o) {
  const long long range = o.value("range", 1000LL);
  RLX_CHECK(range >= 1 && range <= 1000000000, "guess_number options: range in [1, 1e9]");
  auto rng = task_rng(seed, index, "guess_number");
  return {{"target", rng.uniform_int(1, range)}, {"range", range}};
}

}  // namespace

void register_guess_number(env::Registry& r) {
  r.add("guess_number", "long horizon: find a hidden number from higher/lower answers (options: range, max_turns)",
        [](const env::Context& c) { return std::make_unique<GuessNumber>(c); }, generate_guess_number_task);
}

}  // namespace rlx::envs
