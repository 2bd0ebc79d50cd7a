#include "rlx/env/text_env.hpp"

#include <fmt/format.h>

#include <cmath>
#include <memory>

namespace rlx::env {

namespace {

class TextEnv final : public Env {
 public:
  TextEnv(std::shared_ptr<const TextTask> spec, const Tokenizer& tok) : spec_(std::move(spec)), tok_(tok) {}

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    task_ = task;
    done_ = false;
    std::string text;
    try {
      text = spec_->prompt(task_);
    } catch (const std::exception& e) {
      throw Error(fmt::format("environment '{}': the prompt function failed on task {}: {}", spec_->name,
                              task_.dump(), e.what()));
    }
    return tok_.encode(text);
  }

  StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "environment '{}': step after the episode ended", spec_->name);
    auto answer = tok_.decode(action);
    size_t end = answer.size();
    for (const auto& s : spec_->stop)
      if (!s.empty()) end = std::min(end, answer.find(s));
    answer.resize(end);
    double reward = 0;
    try {
      reward = spec_->reward(task_, answer);
    } catch (const std::exception& e) {
      throw Error(fmt::format("environment '{}': the reward function failed on task {} and answer {:?}: {}",
                              spec_->name, task_.dump(), answer, e.what()));
    }
    RLX_CHECK(std::isfinite(reward), "environment '{}': the reward of answer {:?} to task {} is {}", spec_->name,
              answer, task_.dump(), reward);
    done_ = true;
    return {.reward = reward, .done = true};
  }

  std::vector<std::string> stop_strings() const override { return spec_->stop; }
  std::string save_state() const override { return nlohmann::json{{"task", task_}, {"done", done_}}.dump(); }
  void load_state(std::string_view state) override {
    const auto j = nlohmann::json::parse(state, nullptr, /*allow_exceptions=*/false);
    RLX_CHECK(j.is_object() && j.contains("task") && j.contains("done") && j["done"].is_boolean(),
              "environment '{}': not a saved state: {:?}", spec_->name, std::string(state.substr(0, 200)));
    task_ = j["task"];
    done_ = j["done"].get<bool>();
  }

 private:
  std::shared_ptr<const TextTask> spec_;
  const Tokenizer& tok_;
  nlohmann::json task_;
  bool done_ = false;
};

}  // namespace

void add_text_env(TextTask task, Registry& registry) {
  RLX_CHECK(!task.name.empty() && task.prompt && task.reward, "add_text_env: a name, a prompt and a reward are required");
  auto spec = std::make_shared<const TextTask>(std::move(task));
  registry.add(
      spec->name, spec->description, [spec](const Context& c) { return std::make_unique<TextEnv>(spec, *c.tokenizer); },
      spec->tasks);
}

}  // namespace rlx::env
