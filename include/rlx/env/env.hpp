// Environments: multi-turn, token-in/token-out, checkpointable.
//
// An environment sees token ids, never text it must re-encode into the trajectory:
//  - reset(task) returns the first observation's tokens (the prompt);
//  - step(action) receives the exact tokens the policy sampled and returns the tokens the
//    environment adds to the context (loss mask 0), a reward, and whether it is done.
// An environment may decode an action to score it, but the sequence the learner trains
// on is built only from these token ids (Episode below), so a tokenizer that does not
// round-trip text (merges, normalisation, special tokens) cannot change it.
//
// save_state()/load_state() capture everything the environment needs to continue an
// episode in another process (a long-horizon episode checkpointed mid-way).
//
// Environments are made by name from a registry; a user's own environment registers the
// same way as the bundled ones (rlx/env/bundled.hpp):
//
//   rlx::env::Registry::global().add("my_env", "what it does", [](const rlx::env::Context& c) {
//     return std::make_unique<MyEnv>(c);
//   });
//   auto env = rlx::env::Registry::global().make("my_env", ctx);
//   rlx::env::Episode ep = rlx::env::run_episode(*env, task, policy, /*max_turns=*/8);
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/core/error.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx::env {

class Sandbox;

// The environment could not do its job (its sandbox failed, its server died): the lease
// ends as an infra error and is retried; it is never a zero reward.
class InfraError : public Error {
 public:
  using Error::Error;
};

struct StepResult {
  std::vector<TokenId> observation;  // appended to the context with loss mask 0 (may be empty)
  double reward = 0;                 // this turn's reward (an episode's return is the sum)
  bool done = false;
  nlohmann::json info = nlohmann::json::object();
};

// What an environment is built with.
struct Context {
  const Tokenizer* tokenizer = nullptr;  // required: observations are token ids
  const Sandbox* sandbox = nullptr;      // for environments that run code (python_code)
  nlohmann::json options = nlohmann::json::object();  // the environment's own options (config)
  uint64_t seed = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  // Starts an episode; returns the prompt's tokens.
  virtual std::vector<TokenId> reset(const nlohmann::json& task) = 0;
  virtual StepResult step(std::span<const TokenId> action) = 0;
  // The episode so far as text (JSON), enough for load_state() to continue it elsewhere.
  virtual std::string save_state() const = 0;
  virtual void load_state(std::string_view state) = 0;
  // A sequence that ends the policy's turn (the sampler's stop sequence), if any.
  virtual std::vector<std::string> stop_strings() const { return {}; }
};

// A generated task for environments that make their own (index-th of a seeded stream).
using TaskGenerator = std::function<nlohmann::json(uint64_t seed, uint64_t index, const nlohmann::json& options)>;
using Factory = std::function<std::unique_ptr<Env>(const Context&)>;

// What an environment needs from the processes that run it, declared when it registers.
struct EnvNeeds {
  // It runs code it is given (python_code): it gets a Sandbox of its own (Context::sandbox),
  // and its env server runs outside one (namespaces do not nest under the sandbox's filter).
  bool runs_code = false;
};

class Registry {
 public:
  static Registry& global();
  // Throws if `name` is taken.
  void add(const std::string& name, const std::string& description, Factory factory, TaskGenerator generator = {},
           EnvNeeds needs = {});
  bool has(const std::string& name) const;
  // What the environment declared; throws rlx::Error for an unknown name (as make() does).
  EnvNeeds needs(const std::string& name) const;
  // Throws rlx::Error naming the unknown environment and listing the known ones.
  std::unique_ptr<Env> make(const std::string& name, const Context& context) const;
  // Whether the environment makes its own tasks (generate() works).
  bool generates(const std::string& name) const;
  // A generated task; throws if the environment has no generator.
  nlohmann::json generate(const std::string& name, uint64_t seed, uint64_t index, const nlohmann::json& options = {}) const;
  std::vector<std::pair<std::string, std::string>> list() const;  // name, description

 private:
  struct Entry {
    std::string description;
    Factory factory;
    TaskGenerator generator;
    EnvNeeds needs;
  };
  const Entry& find(const std::string& name) const;
  mutable std::mutex m_;
  std::map<std::string, Entry> entries_;
};

// One episode's sequence, built only from token ids: prompt and observations with mask 0,
// actions with mask 1 and their behaviour log-probs.
struct Episode {
  std::vector<TokenId> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> logprobs;
  int32_t prompt_len = 0;
  double reward = 0;  // sum over turns
  int turns = 0;
  bool done = false;
  nlohmann::json info = nlohmann::json::array();  // per turn

  void start(std::span<const TokenId> prompt);
  void add_action(std::span<const TokenId> action, std::span<const float> logprobs = {});
  void add_observation(std::span<const TokenId> observation);
  // Saved with the environment's state, an episode continues in another process.
  nlohmann::json to_json() const;
  static Episode from_json(const nlohmann::json& j);
};

// The policy: given the context so far, the action's tokens (and their log-probs).
struct Action {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
};
using Policy = std::function<Action(std::span<const TokenId> context)>;

// Runs turns until the environment is done or `max_turns` actions were taken. With a
// non-empty `episode` (restored from a checkpoint together with the environment's state)
// it continues that episode instead of resetting. `on_turn` is called after each turn
// (for checkpoints).
Episode run_episode(Env& env, const nlohmann::json& task, const Policy& policy, int max_turns,
                    Episode episode = {}, const std::function<void(const Episode&)>& on_turn = {});

}  // namespace rlx::env
