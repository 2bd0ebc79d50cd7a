// The agent_program environment with a real agent: examples/agents/calculator_agent.js on
// the OpenAI Node SDK, in the sandbox, reaching the policy only through the gateway's unix
// socket. The policy here is scripted (exact tokens), so the turns are known.
// Not tagged [sandbox]: the sandbox's fallback without rlx-sandbox-helper (that suite)
// forks from this multi-threaded process, and the gateway's threads make that child hang
// before it runs the program; agent_program needs the helper (docs/CHAT.md).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "rlx/chat/chat_template.hpp"
#include "rlx/env/bundled.hpp"
#include "rlx/env/env.hpp"
#include "rlx/env/sandbox.hpp"
#include "test_paths.hpp"

using json = nlohmann::json;

namespace {
const std::filesystem::path kQwen3 = std::filesystem::path(rlx::test_paths::kFixtureDir) / "chat" / "qwen3";
const std::filesystem::path kModules = std::filesystem::path(rlx::test_paths::kFixtureDir) / "chat" / "node_modules";
const std::filesystem::path kAgent = std::filesystem::path(rlx::test_paths::kSourceDir) / "examples" / "agents" / "calculator_agent.js";

json options(const std::string& script = kAgent.string()) {
  return {{"command", {"node", script}},
          {"chat_template_dir", kQwen3.string()},
          {"readonly_paths", {std::filesystem::path(script).parent_path().string(), kModules.string()}},
          {"env", {"NODE_PATH=" + kModules.string()}},
          {"call_timeout_s", 30}};
}

struct Fixture {
  Fixture() {
    if (!std::filesystem::exists(kModules / "openai"))
      FAIL("missing " << kModules << ": run scripts/make_chat_template_fixtures.sh (scripts/test.sh does this)");
    rlx::env::register_bundled(rlx::env::Registry::global());
  }
  std::unique_ptr<rlx::Tokenizer> tok = rlx::load_tokenizer(kQwen3 / "tokenizer.json");
  rlx::env::Sandbox sandbox{{.limits = {.wall_s = 60, .cpu_s = 30, .memory_mb = 16384, .processes = 256, .open_files = 256}}};
  std::unique_ptr<rlx::env::Env> make(json opts = options()) {
    rlx::env::Context c{.tokenizer = tok.get(), .sandbox = &sandbox, .options = std::move(opts), .seed = 1};
    return rlx::env::Registry::global().make("agent_program", c);
  }
  std::vector<rlx::TokenId> encode(const std::string& s) const { return tok->encode(s, {.add_special_tokens = false, .parse_special = true}); }
  std::string decode(std::span<const rlx::TokenId> ids) const { return tok->decode(ids); }
};

const std::string kToolCall = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12 * 34 + 5\"}}\n</tool_call><|im_end|>";
const std::string kAnswer = "The answer is 413.<|im_end|>";
const json kTask = {{"prompt", "What is (12 * 34) + 5?"}, {"answer", 413}};
}  // namespace

TEST_CASE("agent_program: a sandboxed SDK agent's calls are the episode's turns", "[env][agent]") {
  Fixture f;
  auto env = f.make();
  auto prompt = env->reset(kTask);
  std::string prompt_text = f.decode(prompt);
  // The first call's messages and tools, rendered by Qwen3's template.
  CHECK_THAT(prompt_text, Catch::StartsWith("<|im_start|>system\nUse the calculator tool"));
  CHECK_THAT(prompt_text, Catch::Contains("\"name\": \"calculator\""));
  CHECK_THAT(prompt_text, Catch::EndsWith("<|im_start|>user\nWhat is (12 * 34) + 5?<|im_end|>\n<|im_start|>assistant\n"));
  CHECK(env->stop_strings() == std::vector<std::string>{"<|im_end|>"});

  // Turn 1: a tool call. The agent runs it and calls again; the new message is appended
  // after the sampled tokens.
  auto step1 = env->step(f.encode(kToolCall));
  INFO("step 1 info: " << step1.info.dump());
  CHECK_FALSE(step1.done);
  CHECK(f.decode(step1.observation) == "\n<|im_start|>user\n<tool_response>\n413\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // The whole conversation as the template renders it is these tokens, in order.
  auto step2 = env->step(f.encode(kAnswer));
  CHECK(step2.done);
  CHECK(step2.reward == 1.0);
  CHECK(step2.info["calls"] == 2);

  // A wrong answer scores 0; an answer without a tool call ends after one turn.
  env->reset(kTask);
  auto wrong = env->step(f.encode("It is 7.<|im_end|>"));
  CHECK(wrong.done);
  CHECK(wrong.reward == 0.0);
}

TEST_CASE("agent_program: a saved episode continues in another environment by replaying the program", "[env][agent]") {
  Fixture f;
  auto first = f.make();
  first->reset(kTask);
  auto obs = first->step(f.encode(kToolCall));
  std::string state = first->save_state();
  first.reset();  // the process that ran it is gone

  auto second = f.make();
  second->load_state(state);
  auto end = second->step(f.encode(kAnswer));
  CHECK(end.done);
  CHECK(end.reward == 1.0);
  CHECK(end.info["calls"] == 2);
}

TEST_CASE("agent_program: a program that fails says why", "[env][agent]") {
  Fixture f;
  auto dir = std::filesystem::temp_directory_path() / "rlx_agent_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "silent.js") << "console.error('no model for me'); process.exit(3);\n";
  }
  auto silent = f.make(options((dir / "silent.js").string()));
  CHECK_THROWS_WITH(silent->reset(kTask), Catch::Contains("before calling the model") && Catch::Contains("no model for me"));
  CHECK_THROWS_WITH(f.make(json{{"chat_template_dir", kQwen3.string()}}), Catch::Contains("'command'"));
}

TEST_CASE("agent_program: a turn cut by length is closed by the template, and the agent asks again", "[env][agent]") {
  Fixture f;
  auto env = f.make();
  env->reset(kTask);
  auto step = env->step(f.encode("Institutes now Past"));  // no stop token: max_new_tokens ended it
  INFO("info: " << step.info.dump());
  REQUIRE_FALSE(step.done);
  CHECK(f.decode(step.observation) == "<|im_end|>\n<|im_start|>user\nPlease answer with a number.<|im_end|>\n<|im_start|>assistant\n");
}
