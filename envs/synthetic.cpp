// synthetic: a decoding-free environment for throughput runs on models of any vocabulary
// (a random-weight Qwen2.5-0.5B shape with model.vocab_size = 151936): the prompt is
// `prompt_tokens` token ids drawn from [0, vocab), no stop sequence (a sample runs to
// rollout.max_new_tokens unless it samples the tokenizer's EOS), and the reward is the share
// of even token ids in the answer, a signal GRPO can learn without any text.
// Task: {"tokens": [ids]}; generated: options prompt_tokens (default 64), vocab (default 151936).
#include "common.hpp"

namespace rlx::envs {

namespace {

class Synthetic final : public env::Env {
 public:
  explicit Synthetic(const env::Context&) {}

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    RLX_CHECK(task.contains("tokens") && task["tokens"].is_array() && !task["tokens"].empty() &&
                  task["tokens"].size() <= 65536,
              "synthetic task: \"tokens\" must be a list of 1 to 65536 token ids");
    std::vector<TokenId> out;
    for (const auto& t : task["tokens"]) {
      RLX_CHECK(t.is_number_integer() && t.get<int64_t>() >= 0, "synthetic task: token ids are integers >= 0");
      out.push_back(t.get<TokenId>());
    }
    done_ = false;
    return out;
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "synthetic: step() after the episode ended");
    done_ = true;
    size_t even = 0;
    for (TokenId t : action) even += t % 2 == 0;
    env::StepResult r;
    r.done = true;
    r.reward = action.empty() ? 0.0 : static_cast<double>(even) / static_cast<double>(action.size());
    return r;
  }

  std::string save_state() const override { return nlohmann::json{{"done", done_}}.dump(); }
  void load_state(std::string_view s) override {
    const auto j = nlohmann::json::parse(s, nullptr, false);
    RLX_CHECK(j.is_object() && j.contains("done") && j["done"].is_boolean(), "synthetic: saved state is not {{\"done\": bool}}");
    done_ = j["done"].get<bool>();
  }

 private:
  bool done_ = false;
};

nlohmann::json generate_synthetic_task(uint64_t seed, uint64_t index, const nlohmann::json& o) {
  const int64_t n = o.value("prompt_tokens", int64_t{64}), vocab = o.value("vocab", int64_t{151936});
  RLX_CHECK(n >= 1 && n <= 65536 && vocab >= 2 && vocab <= (int64_t{1} << 31),
            "synthetic options: prompt_tokens in [1, 65536], vocab in [2, 2^31]");
  auto rng = task_rng(seed, index, "synthetic");
  nlohmann::json tokens = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i) tokens.push_back(rng.uniform_int(0, vocab - 1));
  return {{"tokens", tokens}};
}

}  // namespace

void register_synthetic(env::Registry& r) {
  r.add("synthetic", "random prompt token ids, no stop, reward = share of even ids (throughput runs; options: "
                     "prompt_tokens, vocab)",
        [](const env::Context& c) { return std::make_unique<Synthetic>(c); }, generate_synthetic_task);
}

}  // namespace rlx::envs
