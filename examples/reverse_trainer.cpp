// A trainer with an environment of its own: "reverse" asks for a word backwards, one turn,
// reward 1 for the exact reversal. Registered before trainer_main reads the command line,
// it is there in every process of a run: workers, and the env servers they start.
//   ./reverse_trainer run examples/configs/grpo_arithmetic.yaml env.name=reverse env.options={}
#include <nlohmann/json.hpp>

#include <algorithm>

#include "rlx/core/rng.hpp"
#include "rlx/env/env.hpp"
#include "rlx/launch/main.hpp"

namespace {

class Reverse final : public rlx::env::Env {
 public:
  explicit Reverse(const rlx::env::Context& c) : tok_(*c.tokenizer) {}

  std::vector<rlx::TokenId> reset(const nlohmann::json& task) override {
    word_ = task.at("word").get<std::string>();
    return tok_.encode(fmt::format("Reverse {}:", word_));
  }
  rlx::env::StepResult step(std::span<const rlx::TokenId> action) override {
    auto answer = tok_.decode(action);
    answer = answer.substr(0, answer.find('\n'));
    return {.reward = answer == std::string(word_.rbegin(), word_.rend()) ? 1.0 : 0.0, .done = true};
  }
  std::vector<std::string> stop_strings() const override { return {"\n"}; }
  std::string save_state() const override { return nlohmann::json{{"word", word_}}.dump(); }
  void load_state(std::string_view state) override { word_ = nlohmann::json::parse(state).at("word"); }

 private:
  const rlx::Tokenizer& tok_;
  std::string word_;
};

// Task i: a word of 2 to 4 letters from a, b, c, drawn from a stream keyed by (seed, i).
nlohmann::json make_task(uint64_t seed, uint64_t index, const nlohmann::json&) {
  rlx::RngStream rng(seed, rlx::hash_name("reverse") ^ index);
  std::string word;
  for (auto n = rng.uniform_int(2, 4); n > 0; --n) word += static_cast<char>('a' + rng.uniform_int(0, 2));
  return {{"word", word}, {"answer", std::string(word.rbegin(), word.rend())}};
}

}  // namespace

int main(int argc, char** argv) {
  return rlx::launch::trainer_main(argc, argv, "reverse_trainer", [] {
    rlx::env::Registry::global().add(
        "reverse", "write a word backwards",
        [](const rlx::env::Context& c) { return std::make_unique<Reverse>(c); }, make_task);
  });
}
