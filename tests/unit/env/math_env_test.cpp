// The `math` environment: GSM8K- and MATH-style tasks, prompt keys, the system prompt and
// instruction, chat messages through a model's chat template, the step's info counters,
// checkpointed state, task files with bad lines (named by file and line; skipped and
// counted, or an error with strict), and `rlx env score math` as a user runs it.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>

#include "../helpers.hpp"
#include "env_fixtures.hpp"
#include "rlx/env/env.hpp"
#include "test_paths.hpp"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using rlx::test::gpt2;
rlx::env::Registry& registry() { return rlx::test::bundled_registry(); }

std::unique_ptr<rlx::env::Env> make(json options = json::object()) {
  return registry().make("math", {.tokenizer = &gpt2(), .options = std::move(options), .seed = 1});
}

std::string prompt_of(rlx::env::Env& env, const json& task) { return gpt2().decode(env.reset(task)); }

rlx::env::StepResult answer(rlx::env::Env& env, const json& task, const std::string& response) {
  env.reset(task);
  return env.step(gpt2().encode(response));
}

// A scratch directory per test case, removed at the end.
struct Scratch {
  rlx::test::TempDir tmp;
  const fs::path& dir = tmp.path;
  fs::path write(const std::string& name, const std::string& text) const {
    rlx::test::write_file(tmp / name, text);
    return tmp / name;
  }
};

const json kGsm8k = {{"question", "Tom has 3 boxes of 12 pencils. How many pencils?"},
                     {"answer", "3 boxes hold 3 * 12 = 36 pencils.\n#### 36"}};
const json kMath = {{"problem", "What is $\\frac{1}{2} + \\frac{1}{3}$?"},
                    {"solution", "Add: $\\frac{3}{6} + \\frac{2}{6} = \\boxed{\\frac{5}{6}}$."}};

}  // namespace

TEST_CASE("math env: GSM8K and MATH tasks with the default keys", "[env][math]") {
  auto env = make();
  CHECK(prompt_of(*env, kGsm8k) == kGsm8k["question"].get<std::string>());
  auto r = answer(*env, kGsm8k, "12 * 3 = 36, so the answer is 36.");
  CHECK(r.done);
  CHECK(r.reward == 1);
  CHECK(r.info["outcome"] == "correct");
  CHECK(r.info["extracted"] == "36");
  CHECK(r.info["extractor"] == "answer_is");
  CHECK(r.info["reference"] == "36");
  CHECK(r.info["errors_unextracted"] == 0);
  CHECK(r.info["errors_unparsed"] == 0);
  CHECK(answer(*env, kGsm8k, "#### 35").reward == 0);

  CHECK(prompt_of(*env, kMath) == kMath["problem"].get<std::string>());
  CHECK(answer(*env, kMath, "So we get $\\boxed{\\dfrac{5}{6}}$.").reward == 1);
  CHECK(answer(*env, kMath, "So we get $\\boxed{0.8333333333}$.").reward == 1);
  CHECK(answer(*env, kMath, "So we get $\\boxed{\\frac{5}{7}}$.").reward == 0);
  // MATH-500 style: a final answer field, which wins over the solution.
  CHECK(answer(*env, {{"problem", "?"}, {"solution", "\\boxed{9}"}, {"answer", "3"}}, "\\boxed{3}").reward == 1);
  CHECK(env->stop_strings().empty());  // a reasoning response runs to the end of its turn
}

TEST_CASE("math env: prompt and answer keys, numeric answers, system prompt and instruction", "[env][math]") {
  auto env = make({{"prompt_key", "q"}, {"answer_key", "a"}, {"system_prompt", "You are careful."},
                   {"instruction", "Put the final answer in \\boxed{}."}});
  const json task = {{"q", "2 + 2?"}, {"a", 4}, {"question", "ignored"}};
  CHECK(prompt_of(*env, task) == "You are careful.\n\n2 + 2? Put the final answer in \\boxed{}.");
  CHECK(answer(*env, task, "\\boxed{4}").reward == 1);
  CHECK(answer(*env, {{"q", "half?"}, {"a", 0.5}}, "\\boxed{\\frac12}").reward == 1);
  CHECK_THROWS_WITH(env->reset({{"question", "x"}, {"answer", "1"}}),
                    Catch::Contains("no prompt key 'q'") && Catch::Contains("prompt_key") && Catch::Contains("question"));
  CHECK_THROWS_WITH(env->reset({{"q", "x"}}), Catch::Contains("no answer key 'a'") && Catch::Contains("answer_key"));
  CHECK_THROWS_WITH(make()->reset({{"question", "x"}}),
                    Catch::Contains("no answer key among answer, solution") && Catch::Contains("the task has: question"));
  CHECK_THROWS_WITH(make()->reset({{"question", "x"}, {"answer", json::array()}}), Catch::Contains("'answer' must be"));
  CHECK_THROWS_WITH(make({{"answr_key", "a"}}), Catch::Contains("unknown option env.options.answr_key") &&
                                                    Catch::Contains("did you mean 'answer_key'"));
  CHECK_THROWS_WITH(make({{"extract", json::array({"boxd"})}}), Catch::Contains("unknown extractor 'boxd'"));
}

TEST_CASE("math env: chat messages through the model's chat template", "[env][math]") {
  Scratch s;
  s.write("chat_template.jinja",
          "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% if think is defined and not think %}<nothink>{% endif %}{% endif %}");
  s.write("tokenizer_config.json", R"({"eos_token": "<|end|>"})");
  auto env = make({{"chat_template_dir", s.dir.string()},
                   {"system_prompt", "Be brief."},
                   {"instruction", "Answer in \\boxed{}."},
                   {"chat_template_kwargs", {{"think", false}}}});
  CHECK(prompt_of(*env, kGsm8k) == "<|system|>Be brief.<|end|>\n<|user|>" + kGsm8k["question"].get<std::string>() +
                                       " Answer in \\boxed{}.<|end|>\n<|assistant|><nothink>");
  CHECK(env->stop_strings() == std::vector<std::string>{"<|end|>"});
  const json chat = {{"messages", {{{"role", "system"}, {"content", "Own system."}}, {{"role", "user"}, {"content", "1+1?"}}}},
                     {"answer", "2"}};
  CHECK(prompt_of(*env, chat) ==
        "<|system|>Own system.<|end|>\n<|user|>1+1? Answer in \\boxed{}.<|end|>\n<|assistant|><nothink>");
  CHECK(answer(*env, chat, "\\boxed{2}<|end|>").reward == 1);
  // Without a template, the messages' text.
  CHECK(prompt_of(*make(), chat) == "Own system.\n\n1+1?");
}

TEST_CASE("math env: counters for answers not found or not readable; format reward", "[env][math]") {
  auto env = make({{"format_reward", 0.1}, {"extract", json::array({"boxed", "hash"})}});
  auto none = answer(*env, kGsm8k, "It is 36.");  // last_number is switched off
  CHECK(none.reward == 0);
  CHECK(none.info["outcome"] == "unextracted");
  CHECK(none.info["errors_unextracted"] == 1);
  CHECK(none.info["extracted"].is_null());
  auto broken = answer(*env, kGsm8k, "\\boxed{\\frac{36}{}}");
  CHECK(broken.info["outcome"] == "unparsed");
  CHECK(broken.info["errors_unparsed"] == 1);
  CHECK(broken.info["detail"].get<std::string>().find("cannot read") != std::string::npos);
  auto wrong = answer(*env, kGsm8k, "#### 35");
  CHECK(wrong.info["outcome"] == "wrong");
  CHECK(wrong.reward == Approx(0.1));
}

TEST_CASE("math env: the episode's state continues in another instance", "[env][math]") {
  auto a = make();
  a->reset(kMath);
  const auto state = a->save_state();
  auto b = make();
  b->load_state(state);
  CHECK(b->step(gpt2().encode("\\boxed{5/6}")).reward == 1);
  CHECK_THROWS_WITH(b->step(gpt2().encode("\\boxed{5/6}")), Catch::Contains("after the episode ended"));
  CHECK_THROWS_WITH(b->load_state("{"), Catch::Contains("math: saved state is not JSON"));
}

TEST_CASE("math env: a task file's bad lines are named by file and line", "[env][math]") {
  Scratch s;
  const auto file = s.write("tasks.jsonl", kGsm8k.dump() + "\n" +                       // 1
                                               "{\"question\": \"broken\"\n" +           // 2: bad JSON
                                               "{\"question\": \"no answer\"}\n" +       // 3: no answer key
                                               "\n" +                                    // 4: blank
                                               kMath.dump() + "\n");                     // 5
  SECTION("skipped and counted by default") {
    const json o = {{"data", file.string()}};
    CHECK(registry().generate("math", 0, 0, o) == kGsm8k);
    CHECK(registry().generate("math", 0, 1, o) == kMath);
    CHECK(registry().generate("math", 0, 2, o) == kGsm8k);  // index % usable tasks
  }
  SECTION("an error with strict") {
    CHECK_THROWS_WITH(registry().generate("math", 0, 0, {{"data", file.string()}, {"strict", true}}),
                      Catch::Contains(file.string() + ":2") && Catch::Contains("not valid JSON"));
    const auto no_answer = s.write("no_answer.jsonl", kGsm8k.dump() + "\n{\"question\": \"no answer\"}\n");
    CHECK_THROWS_WITH(registry().generate("math", 0, 0, {{"data", no_answer.string()}, {"strict", true}}),
                      Catch::Contains(no_answer.string() + ":2: no answer key"));
  }
  SECTION("a file without a usable task, or none at all") {
    const auto bad = s.write("bad.jsonl", "not json\n");
    CHECK_THROWS_WITH(registry().generate("math", 0, 0, {{"data", bad.string()}}), Catch::Contains("no usable task"));
    CHECK_THROWS_WITH(registry().generate("math", 0, 0, {{"data", (s.dir / "missing.jsonl").string()}}),
                      Catch::Contains("cannot read"));
  }
  SECTION("built-in tasks without a file, each one scorable") {
    auto env = make();
    for (uint64_t i = 0; i < 4; ++i) CHECK_NOTHROW(env->reset(registry().generate("math", 0, i, json::object())));
  }
}

TEST_CASE("math env: rlx env score math prints a line per answer and names bad lines", "[env][math][cli]") {
  Scratch s;
  const auto input = s.write("answers.jsonl",
                             json({{"response", "so \\boxed{\\frac{1}{2}}"}, {"answer", "0.5"}}).dump() + "\n" +
                                 json({{"response", "The answer is 7."}, {"answer", "#### 8"}}).dump() + "\n" +
                                 "{oops\n" + json({{"answer", "1"}}).dump() + "\n" +
                                 json({{"response", "#### 3"}, {"answer", 3}}).dump() + "\n");
  const auto err = s.dir / "stderr.txt";
  const std::string cmd = std::string(rlx::test_paths::kCli) + " env score math --input " + input.string() +
                          " --option format_reward=0.25 2> " + err.string();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  std::vector<json> lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) lines.push_back(json::parse(buf));
  const int status = ::pclose(pipe);
  CHECK(WEXITSTATUS(status) == 1);  // bad lines make the exit status 1, after every good line is scored
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["reward"] == 1);
  CHECK(lines[0]["extracted"] == "\\frac{1}{2}");
  CHECK(lines[0]["line"] == 1);
  CHECK(lines[1]["reward"] == 0.25);
  CHECK(lines[1]["outcome"] == "wrong");
  CHECK(lines[2]["reward"] == 1);
  CHECK(lines[2]["line"] == 5);
  std::ifstream in(err);
  const std::string errors((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(errors, Catch::Contains(input.string() + ":3") && Catch::Contains(input.string() + ":4: no text \"response\""));
}
