// Environments: the registry, the token-in/token-out invariant, scoring of each bundled
// environment (expected values derived by hand in the comments), and checkpoint/resume of
// a long-horizon episode in a separate object (as another process would).
#include <catch2/catch.hpp>
#include <filesystem>
#include <mutex>

#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/env/options.hpp"
#include "rlx/env/sandbox.hpp"
#include "rlx/env/text_env.hpp"
#include "env_fixtures.hpp"
#include "test_paths.hpp"

using nlohmann::json;
using rlx::TokenId;

namespace {

using rlx::test::gpt2;
rlx::env::Registry& registry() { return rlx::test::bundled_registry(); }

std::unique_ptr<rlx::env::Env> make(const std::string& name, json options = json::object(),
                                    const rlx::env::Sandbox* sandbox = nullptr) {
  return registry().make(name, {.tokenizer = &gpt2(), .sandbox = sandbox, .options = std::move(options), .seed = 1});
}

// A policy that answers with fixed texts, turn after turn.
rlx::env::Policy scripted(std::vector<std::string> texts) {
  auto turn = std::make_shared<size_t>(0);
  return [texts = std::move(texts), turn](std::span<const TokenId>) {
    const std::string& t = texts.at(std::min(*turn, texts.size() - 1));
    ++*turn;
    return rlx::env::Action{gpt2().encode(t), {}};
  };
}

double score(const std::string& env, const json& task, const std::string& answer) {
  auto e = make(env);
  e->reset(task);
  return e->step(gpt2().encode(answer)).reward;
}

}  // namespace

TEST_CASE("registry: bundled environments, a user's environment, clear errors", "[env]") {
  rlx::env::Registry reg;
  rlx::env::register_bundled(reg);
  rlx::env::register_bundled(reg);  // idempotent
  for (const char* n : {"arithmetic", "countdown", "calculator", "python_code", "guess_number", "synthetic"}) CHECK(reg.has(n));
  // A user's environment registers the same way.
  struct Echo final : rlx::env::Env {
    std::vector<TokenId> reset(const json&) override { return {1, 2}; }
    rlx::env::StepResult step(std::span<const TokenId> a) override {
      return {.observation = {}, .reward = static_cast<double>(a.size()), .done = true};
    }
    std::string save_state() const override { return "{}"; }
    void load_state(std::string_view) override {}
  };
  reg.add("echo", "test", [](const rlx::env::Context&) { return std::make_unique<Echo>(); });
  CHECK_THROWS_WITH(reg.add("echo", "again", [](const rlx::env::Context&) { return std::make_unique<Echo>(); }),
                    Catch::Contains("already registered"));
  auto e = reg.make("echo", {.tokenizer = &gpt2()});
  CHECK(e->reset({}) == std::vector<TokenId>{1, 2});
  CHECK_THROWS_WITH(reg.make("nope", {.tokenizer = &gpt2()}), Catch::Contains("unknown environment 'nope'") && Catch::Contains("arithmetic"));
  CHECK_THROWS_WITH(reg.make("echo", {}), Catch::Contains("tokenizer is required"));
  CHECK_THROWS_WITH(reg.generate("echo", 0, 0), Catch::Contains("does not generate tasks"));
  // What an environment needs is declared, not guessed from its name.
  CHECK(reg.needs("python_code").runs_code);
  CHECK_FALSE(reg.needs("arithmetic").runs_code);
  CHECK_FALSE(reg.needs("echo").runs_code);
  reg.add("my_code", "runs code", [](const rlx::env::Context&) { return std::make_unique<Echo>(); }, {},
          {.runs_code = true});
  CHECK(reg.needs("my_code").runs_code);
  CHECK_THROWS_WITH(reg.needs("nope"), Catch::Contains("unknown environment 'nope'"));
}

TEST_CASE("token-in/token-out: the episode holds exactly the sampled and returned ids", "[env]") {
  const auto& tok = gpt2();
  // An action the tokenizer would never produce from its text: " hello" split in two
  // pieces. Decoding and re-encoding would merge them; the episode must not.
  const std::vector<TokenId> split = [&] {
    auto a = tok.encode(" hel"), b = tok.encode("lo");
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }();
  REQUIRE(tok.encode(tok.decode(split)) != split);
  auto env = make("guess_number", {{"max_turns", 3}});
  const json task = {{"target", 7}, {"range", 10}};
  std::vector<TokenId> expected = env->reset(task);
  env = make("guess_number", {{"max_turns", 3}});
  std::vector<std::vector<TokenId>> observations;
  std::vector<std::vector<TokenId>> actions = {split, tok.encode(" 3"), tok.encode("9")};
  size_t turn = 0;
  auto policy = [&](std::span<const TokenId>) { return rlx::env::Action{actions[turn++], {}}; };
  struct Recorder final : rlx::env::Env {  // wraps the env to see what it returned
    rlx::env::Env& inner;
    std::vector<std::vector<TokenId>>& seen;
    Recorder(rlx::env::Env& e, std::vector<std::vector<TokenId>>& s) : inner(e), seen(s) {}
    std::vector<TokenId> reset(const json& t) override { return inner.reset(t); }
    rlx::env::StepResult step(std::span<const TokenId> a) override {
      auto r = inner.step(a);
      seen.push_back(r.observation);
      return r;
    }
    std::string save_state() const override { return inner.save_state(); }
    void load_state(std::string_view s) override { inner.load_state(s); }
  } rec(*env, observations);
  const auto ep = rlx::env::run_episode(rec, task, policy, 3);
  REQUIRE(ep.turns == 3);
  std::vector<uint8_t> mask(expected.size(), 0);
  for (size_t t = 0; t < 3; ++t) {
    expected.insert(expected.end(), actions[t].begin(), actions[t].end());
    mask.insert(mask.end(), actions[t].size(), 1);
    if (t < 2) {  // the last turn ends the episode: no observation after it
      expected.insert(expected.end(), observations[t].begin(), observations[t].end());
      mask.insert(mask.end(), observations[t].size(), 0);
    }
  }
  CHECK(ep.tokens == expected);
  CHECK(ep.loss_mask == mask);
  CHECK(ep.prompt_len == static_cast<int32_t>(env->reset(task).size()));
  // And the sequence is not what re-tokenizing its text would give.
  CHECK(tok.encode(tok.decode(ep.tokens)) != ep.tokens);
}

TEST_CASE("arithmetic and countdown score exactly", "[env]") {
  // arithmetic: the last integer of the answer.
  CHECK(score("arithmetic", {{"prompt", "Compute 2 + 3."}, {"answer", 5}}, "2 + 3 = 5") == 1.0);
  CHECK(score("arithmetic", {{"prompt", "Compute 2 + 3."}, {"answer", 5}}, "5, no wait, 6") == 0.0);
  CHECK(score("arithmetic", {{"prompt", "Compute 2 - 9."}, {"answer", -7}}, "The answer is -7.") == 1.0);
  // Generated tasks are deterministic per (seed, index) and consistent with their answer.
  const json t1 = registry().generate("arithmetic", 3, 17, {{"digits", 3}, {"terms", 3}});
  CHECK(t1 == registry().generate("arithmetic", 3, 17, {{"digits", 3}, {"terms", 3}}));
  CHECK(t1 != registry().generate("arithmetic", 3, 18, {{"digits", 3}, {"terms", 3}}));
  CHECK(score("arithmetic", t1, std::to_string(t1["answer"].get<long long>())) == 1.0);
  CHECK_THROWS_WITH(registry().generate("arithmetic", 0, 0, {{"digits", 9}}), Catch::Contains("digits in [1, 6]"));
  // countdown: numbers [3, 4, 6, 8], target 24. (8 - 4) * 6 = 24 uses 8, 4, 6: hit.
  const json cd = {{"numbers", {3, 4, 6, 8}}, {"target", 24}};
  CHECK(score("countdown", cd, "(8 - 4) * 6") == 1.0);
  CHECK(score("countdown", cd, "(8 - 4) * 6 = 24") == 1.0);
  CHECK(score("countdown", cd, "8 * 3") == 1.0);
  CHECK(score("countdown", cd, "6 * 4 * 1") == 0.0);   // 1 is not a given number
  CHECK(score("countdown", cd, "8 * 8 - 40") == 0.0);  // 8 twice, 40 not given
  CHECK(score("countdown", cd, "24") == 0.0);          // 24 is not a given number
  CHECK(score("countdown", cd, "(8 - 4 * 6") == 0.0);  // malformed
  const json gen = registry().generate("countdown", 1, 5);
  CHECK(gen["numbers"].size() == 4);
}

TEST_CASE("calculator: a multi-turn tool call, then the answer", "[env]") {
  auto env = make("calculator", {{"max_calls", 2}});
  const json task = {{"prompt", "What is 123 * 45 - 67?"}, {"answer", 5468}};
  const auto ep = rlx::env::run_episode(*env, task, scripted({"<calc>123 * 45</calc>", "<calc>5535 - 67</calc>", "Answer: 5468"}), 5);
  CHECK(ep.turns == 3);
  CHECK(ep.done);
  CHECK(ep.reward == 1.0);
  // The tool's answers are in the context, as tokens with mask 0.
  const std::string text = gpt2().decode(ep.tokens);
  CHECK_THAT(text, Catch::Contains("<result>5535</result>") && Catch::Contains("<result>5468</result>"));
  CHECK(ep.info[0]["result"] == "5535");
  // Too many calls: reward 0, done.
  auto env2 = make("calculator", {{"max_calls", 1}});
  const auto ep2 = rlx::env::run_episode(*env2, task, scripted({"<calc>1+1</calc>"}), 5);
  CHECK(ep2.done);
  CHECK(ep2.reward == 0.0);
  CHECK(ep2.turns == 2);
  // A malformed expression is answered with an error, not a crash.
  auto env3 = make("calculator");
  env3->reset(task);
  const auto r = env3->step(gpt2().encode("<calc>12 +* 3</calc>"));
  CHECK_THAT(gpt2().decode(r.observation), Catch::StartsWith("<result>error:"));
}

TEST_CASE("guess_number: checkpointed mid-episode and resumed elsewhere gives the same episode", "[env]") {
  // Binary search over [1, 1000] for 700: 500 (higher), 750 (lower), 625 (higher), 687
  // (higher), 718 (lower), 702 (lower), 694 (higher), 698 (higher), 700: found on turn 9.
  auto bisect = [](std::span<const TokenId> ctx) {
    const std::string text = gpt2().decode(ctx);
    long long lo = 1, hi = 1000;
    size_t pos = 0;
    long long last = 0;
    // Replay the feedback in the context to narrow the interval.
    while ((pos = text.find("Guess: ", pos)) != std::string::npos) {
      pos += 7;
      const auto end = text.find('\n', pos);
      if (end == std::string::npos) break;
      last = std::stoll(text.substr(pos, end - pos));
      const auto fb = text.substr(end + 1, 6);
      if (fb.starts_with("Higher")) lo = last + 1;
      else if (fb.starts_with("Lower")) hi = last - 1;
    }
    return rlx::env::Action{gpt2().encode(std::to_string((lo + hi) / 2) + "\n"), {}};
  };
  const json task = {{"target", 700}, {"range", 1000}};
  auto whole_env = make("guess_number");
  const auto whole = rlx::env::run_episode(*whole_env, task, bisect, 20);
  CHECK(whole.done);
  CHECK(whole.reward == 1.0);
  CHECK(whole.turns == 9);

  // Stop after 4 turns; save the environment's state and the episode as text.
  auto first = make("guess_number");
  std::string env_state, ep_state;
  const auto part = rlx::env::run_episode(*first, task, bisect, 4, {}, [&](const rlx::env::Episode& e) {
    env_state = first->save_state();
    ep_state = e.to_json().dump();
  });
  CHECK(part.turns == 4);
  CHECK_FALSE(part.done);
  first.reset();
  // A fresh environment object (another process would do the same from the strings).
  auto second = make("guess_number");
  second->load_state(env_state);
  const auto resumed = rlx::env::run_episode(*second, task, bisect, 20, rlx::env::Episode::from_json(json::parse(ep_state)));
  CHECK(resumed.tokens == whole.tokens);
  CHECK(resumed.loss_mask == whole.loss_mask);
  CHECK(resumed.turns == whole.turns);
  CHECK(resumed.reward == whole.reward);
  // Corrupt state is an error that says where.
  CHECK_THROWS_WITH(second->load_state("{\"target\": 3}"), Catch::Contains("guess_number state") && Catch::Contains("range"));
  CHECK_THROWS_WITH(rlx::env::Episode::from_json(json{{"tokens", {1, 2}}}), Catch::Contains("episode checkpoint"));
}

TEST_CASE("python_code: hidden tests in the sandbox, early exits and fake output do not score", "[env][sandbox]") {
  rlx::env::Sandbox sandbox({.limits = {.wall_s = 10}});
  const json task = registry().generate("python_code", 0, 2);  // fib, 4 tests
  auto run = [&](const std::string& code) {
    auto env = make("python_code", json::object(), &sandbox);
    env->reset(task);
    return env->step(gpt2().encode("```python\n" + code + "\n```")).reward;
  };
  CHECK(run("def fib(n):\n    a, b = 0, 1\n    for _ in range(n): a, b = b, a + b\n    return a") == 1.0);
  // Right for small n only: fib(0), fib(1) pass, fib(10) and fib(50) do not -> 2/4.
  CHECK(run("def fib(n):\n    return n if n < 2 else 0") == 0.5);
  CHECK(run("import sys\nsys.exit(0)") == 0.0);
  CHECK(run("import os\nos._exit(0)") == 0.0);
  CHECK(run("exit(0)") == 0.0);
  CHECK(run("print('passed'); print('ALL TESTS PASSED')") == 0.0);
  // Guessing harness lines (every index, many values) scores nothing: repeats fail.
  CHECK(run("import sys\nfor i in range(4):\n    for v in range(100): print('@@rlx', sys.stdin.readline(), i, v)") == 0.0);
  CHECK(run("def fib(n): return 1/0") == 0.0);
}

TEST_CASE("env options from a config: options reach the environment, bad keys are named", "[env]") {
  const std::string yaml =
      "name: arithmetic\n"
      "options: {digits: 3, terms: '4', ops: '+'}\n"
      "max_turns: 2\n"
      "sandbox: {limits: {wall_s: 5}}\n";
  const auto o = rlx::config::load_string<rlx::env::EnvOptions>(yaml, std::vector<std::string>{"sandbox.limits.memory_mb=256"});
  CHECK(o.max_turns == 2);
  CHECK(o.sandbox.limits.wall_s == 5);
  CHECK(o.sandbox.limits.memory_mb == 256);
  const json opts = o.options_json();
  CHECK(opts == json{{"digits", 3}, {"terms", 4}, {"ops", "+"}});
  // The options drive the environment's generator: 4 terms of 3 digits, only '+'.
  const json task = registry().generate(o.name, 0, 0, opts);
  const std::string prompt = task["prompt"];
  CHECK(std::count(prompt.begin(), prompt.end(), '+') == 3);
  CHECK_THROWS_WITH(rlx::config::load_string<rlx::env::EnvOptions>("sandbox: {limits: {wal_s: 5}}"),
                    Catch::Contains("sandbox.limits.wal_s") && Catch::Contains("wall_s"));
  CHECK_THROWS_WITH(rlx::config::load_string<rlx::env::EnvOptions>("sandbox: {missing_layer: maybe}"),
                    Catch::Contains("sandbox.missing_layer"));
}

TEST_CASE("a text env: prompt and reward functions make a checkpointable single-turn environment", "[env]") {
  rlx::env::Registry r;
  rlx::env::add_text_env({.name = "echo",
                          .description = "say the word",
                          .prompt = [](const json& t) { return "Say " + t.at("word").get<std::string>() + ":"; },
                          .reward = [](const json& t, std::string_view answer) {
                            if (answer == "boom") throw std::runtime_error("cannot score this");
                            return answer == " " + t.at("word").get<std::string>() ? 1.0 : 0.0;
                          },
                          .tasks = [](uint64_t, uint64_t i, const json&) -> json { return {{"word", i % 2 ? "cat" : "dog"}}; }},
                         r);
  CHECK_THROWS_WITH(rlx::env::add_text_env({.name = "echo", .prompt = [](const json&) { return std::string(); },
                                            .reward = [](const json&, std::string_view) { return 0.0; }}, r),
                    Catch::Contains("already registered"));
  CHECK_THROWS_WITH(rlx::env::add_text_env({.name = "no_reward", .prompt = [](const json&) { return std::string(); }}, r),
                    Catch::Contains("a reward"));
  REQUIRE(r.generates("echo"));
  const auto task = r.generate("echo", 1, 3);
  CHECK(task["word"] == "cat");
  const rlx::env::Context ctx{.tokenizer = &gpt2()};
  auto env = r.make("echo", ctx);
  CHECK(env->stop_strings() == std::vector<std::string>{"\n"});
  auto answer = [&](const std::string& text) {
    return [&gpt2 = gpt2(), text](std::span<const TokenId>) { return rlx::env::Action{.tokens = gpt2.encode(text)}; };
  };
  // The answer ends at the stop string: " cat\nmore" scores as " cat".
  auto ep = rlx::env::run_episode(*env, task, answer(" cat\nmore"), 4);
  CHECK(gpt2().decode(std::span<const TokenId>(ep.tokens.data(), static_cast<size_t>(ep.prompt_len))) == "Say cat:");
  CHECK(ep.reward == 1.0);
  CHECK(ep.done);
  CHECK(ep.turns == 1);
  CHECK(rlx::env::run_episode(*env, task, answer(" dog"), 4).reward == 0.0);
  // Checkpointed after the prompt, continued by another instance (as another process would).
  auto first = r.make("echo", ctx);
  first->reset(task);
  const auto state = first->save_state();
  auto second = r.make("echo", ctx);
  second->load_state(state);
  CHECK(second->step(gpt2().encode(" cat")).reward == 1.0);
  CHECK_THROWS_WITH(second->step(gpt2().encode(" cat")), Catch::Contains("after the episode ended"));
  CHECK_THROWS_WITH(second->load_state("{\"word\": 1}"), Catch::Contains("not a saved state"));
  // A reward function that throws names the environment, the task and the answer.
  auto third = r.make("echo", ctx);
  third->reset(task);
  CHECK_THROWS_WITH(third->step(gpt2().encode("boom")),
                    Catch::Contains("environment 'echo'") && Catch::Contains("cannot score this") &&
                        Catch::Contains("\"boom\""));
}

TEST_CASE("synthetic: token ids in and out, no stop, the share of even ids as reward", "[env]") {
  rlx::env::Registry reg;
  rlx::env::register_bundled(reg);
  const json options = {{"prompt_tokens", 7}, {"vocab", 151936}};
  const auto task = reg.generate("synthetic", 3, 11, options);
  REQUIRE(task == reg.generate("synthetic", 3, 11, options));  // a task is a function of (seed, index)
  REQUIRE(task != reg.generate("synthetic", 3, 12, options));
  auto e = reg.make("synthetic", {.tokenizer = &gpt2(), .options = options});
  const auto prompt = e->reset(task);
  REQUIRE(prompt.size() == 7);
  for (TokenId t : prompt) REQUIRE((t >= 0 && t < 151936));
  REQUIRE(e->stop_strings().empty());
  const std::vector<TokenId> action{150000, 3, 8, 151935};
  REQUIRE(e->step(action).reward == 0.5);
  REQUIRE_THROWS_WITH(e->step(action), Catch::Contains("after the episode ended"));
  REQUIRE_THROWS_WITH(e->reset(json{{"tokens", json::array()}}), Catch::Contains("1 to 65536 token ids"));
  REQUIRE_THROWS_WITH(reg.generate("synthetic", 0, 0, json{{"vocab", 1}}), Catch::Contains("vocab in [2"));
}
