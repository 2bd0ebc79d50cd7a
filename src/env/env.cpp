#include "rlx/env/env.hpp"

#include <fmt/format.h>

#include "rlx/core/error.hpp"

namespace rlx::env {

Registry& Registry::global() {
  static Registry r;
  return r;
}

void Registry::add(const std::string& name, const std::string& description, Factory factory, TaskGenerator generator,
                   EnvNeeds needs) {
  RLX_CHECK(!name.empty() && factory, "env registry: a name and a factory are required");
  std::lock_guard lock(m_);
  RLX_CHECK(!entries_.count(name), "env registry: '{}' is already registered", name);
  entries_.emplace(name, Entry{description, std::move(factory), std::move(generator), needs});
}

EnvNeeds Registry::needs(const std::string& name) const {
  std::lock_guard lock(m_);
  return find(name).needs;
}

bool Registry::has(const std::string& name) const {
  std::lock_guard lock(m_);
  return entries_.count(name) > 0;
}

const Registry::Entry& Registry::find(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string known;
    for (const auto& [n, _] : entries_) known += (known.empty() ? "" : ", ") + n;
    throw Error(fmt::format("unknown environment '{}' (registered: {})", name, known.empty() ? "none" : known));
  }
  return it->second;
}

std::unique_ptr<Env> Registry::make(const std::string& name, const Context& context) const {
  Factory f;
  {
    std::lock_guard lock(m_);
    f = find(name).factory;
  }
  RLX_CHECK(context.tokenizer, "environment '{}': a tokenizer is required", name);
  return f(context);
}

bool Registry::generates(const std::string& name) const {
  std::lock_guard lock(m_);
  return static_cast<bool>(find(name).generator);
}

nlohmann::json Registry::generate(const std::string& name, uint64_t seed, uint64_t index, const nlohmann::json& options) const {
  TaskGenerator g;
  {
    std::lock_guard lock(m_);
    g = find(name).generator;
  }
  RLX_CHECK(g, "environment '{}' does not generate tasks (give it a dataset)", name);
  return g(seed, index, options.is_null() ? nlohmann::json::object() : options);
}

std::vector<std::pair<std::string, std::string>> Registry::list() const {
  std::lock_guard lock(m_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [n, e] : entries_) out.emplace_back(n, e.description);
  return out;
}

// --- Episode ---------------------------------------------------------------------------

void Episode::start(std::span<const TokenId> prompt) {
  RLX_CHECK(tokens.empty(), "episode: start() on an episode that already has tokens");
  tokens.assign(prompt.begin(), prompt.end());
  loss_mask.assign(prompt.size(), 0);
  logprobs.assign(prompt.size(), 0.f);
  prompt_len = static_cast<int32_t>(prompt.size());
}

void Episode::add_action(std::span<const TokenId> action, std::span<const float> lp) {
  RLX_CHECK(lp.empty() || lp.size() == action.size(), "episode: {} log-probs for {} action tokens", lp.size(), action.size());
  tokens.insert(tokens.end(), action.begin(), action.end());
  loss_mask.insert(loss_mask.end(), action.size(), 1);
  if (lp.empty()) logprobs.insert(logprobs.end(), action.size(), 0.f);
  else logprobs.insert(logprobs.end(), lp.begin(), lp.end());
}

void Episode::add_observation(std::span<const TokenId> obs) {
  tokens.insert(tokens.end(), obs.begin(), obs.end());
  loss_mask.insert(loss_mask.end(), obs.size(), 0);
  logprobs.insert(logprobs.end(), obs.size(), 0.f);
}

nlohmann::json Episode::to_json() const {
  return {{"tokens", tokens}, {"loss_mask", loss_mask}, {"logprobs", logprobs}, {"prompt_len", prompt_len},
          {"reward", reward}, {"turns", turns},         {"done", done},         {"info", info}};
}

Episode Episode::from_json(const nlohmann::json& j) {
  Episode e;
  try {
    j.at("tokens").get_to(e.tokens);
    j.at("loss_mask").get_to(e.loss_mask);
    j.at("logprobs").get_to(e.logprobs);
    e.prompt_len = j.at("prompt_len").get<int32_t>();
    e.reward = j.at("reward").get<double>();
    e.turns = j.at("turns").get<int>();
    e.done = j.at("done").get<bool>();
    e.info = j.at("info");
  } catch (const nlohmann::json::exception& ex) {
    throw Error(fmt::format("episode checkpoint: {}", ex.what()));
  }
  RLX_CHECK(e.loss_mask.size() == e.tokens.size() && e.logprobs.size() == e.tokens.size() && e.prompt_len >= 0 &&
                static_cast<size_t>(e.prompt_len) <= e.tokens.size(),
            "episode checkpoint: tokens, loss_mask and logprobs differ in length or prompt_len is out of range");
  return e;
}

Episode run_episode(Env& env, const nlohmann::json& task, const Policy& policy, int max_turns, Episode ep,
                    const std::function<void(const Episode&)>& on_turn) {
  RLX_CHECK(max_turns >= 1, "run_episode: max_turns must be >= 1");
  if (ep.tokens.empty()) ep.start(env.reset(task));
  while (!ep.done && ep.turns < max_turns) {
    Action a = policy(ep.tokens);
    ep.add_action(a.tokens, a.logprobs);
    StepResult r = env.step(a.tokens);
    ++ep.turns;
    ep.reward += r.reward;
    ep.done = r.done;
    ep.info.push_back(std::move(r.info));
    if (!ep.done) ep.add_observation(r.observation);
    if (on_turn) on_turn(ep);
  }
  return ep;
}

}  // namespace rlx::env
