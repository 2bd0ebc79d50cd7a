// Judging code on stdin/stdout and call-based cases (env/code_judge.hpp): the pure parts
// (output comparison, code extraction, case selection, test parsing with named errors),
// then real programs in the real sandbox (a right answer, a wrong one, an endless loop, a
// crash, a flood of output, too much memory, a time budget), then `python_code` on
// APPS-style tasks and task files, and `rlx env score python_code` as a user runs it.
#include "rlx/env/code_judge.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "../helpers.hpp"
#include "env_fixtures.hpp"
#include "rlx/core/clock.hpp"
#include "rlx/env/sandbox.hpp"
#include "test_paths.hpp"

using nlohmann::json;
namespace code = rlx::env::code;
using code::CaseVerdict;

namespace {

const json kSum = {{"inputs", {"1 2\n", "-5 5\n", "1000000000000 1\n"}}, {"outputs", {"3\n", "0\n", "1000000000001\n"}}};
const char* kSumRight = "a, b = map(int, input().split())\nprint(a + b)\n";

code::Judgement run(const std::string& program, const json& io, code::JudgeOptions o = {}) {
  static const rlx::env::Sandbox sandbox({.limits = {.wall_s = 20, .cpu_s = 20}});
  return code::judge(sandbox, program, code::TestSpec::from_json(io, "test"), o);
}

}  // namespace

TEST_CASE("code judge: stdout comparison ignores trailing whitespace and trailing newlines only", "[env][code]") {
  CHECK(code::outputs_match("3\n", "3\n", 0));
  CHECK(code::outputs_match("3", "3\n", 0));
  CHECK(code::outputs_match("3 \t\r\n\n\n", "3\n", 0));
  CHECK(code::outputs_match("1 2 \r\n3\r\n", "1 2\n3", 0));
  CHECK(code::outputs_match("", "\n", 0));
  CHECK_FALSE(code::outputs_match(" 3\n", "3\n", 0));       // leading space is content
  CHECK_FALSE(code::outputs_match("1  2\n", "1 2\n", 0));   // so is inner spacing, without a tolerance
  CHECK_FALSE(code::outputs_match("3\n\n4\n", "3\n4\n", 0));  // an empty line inside counts
  CHECK_FALSE(code::outputs_match("3\n4\n", "3\n", 0));
  CHECK_FALSE(code::outputs_match("", "0\n", 0));
  // With a tolerance numbers compare as numbers, token by token, line by line.
  CHECK(code::outputs_match("0.3333333\n", "0.333333333\n", 1e-6));
  CHECK(code::outputs_match("1  2.0000001 x\n", "1 2 x\n", 1e-6));
  CHECK(code::outputs_match("1000001\n", "1e6\n", 1e-6));  // relative
  CHECK_FALSE(code::outputs_match("0.34\n", "0.333333\n", 1e-6));
  CHECK_FALSE(code::outputs_match("1 2\n", "1\n2\n", 1e-6));
  CHECK_FALSE(code::outputs_match("y\n", "x\n", 1e-6));
}

TEST_CASE("code judge: call results match JSON values, a one-element list and a tolerance", "[env][code]") {
  CHECK(code::values_match(json(3), json(3), 0));
  CHECK(code::values_match(json(3), json(3.0), 0));
  CHECK(code::values_match(json(3), json::array({3}), 0));  // APPS wraps outputs in a list
  CHECK(code::values_match(json::array({1, 2}), json::array({1, 2}), 0));
  CHECK(code::values_match(json::array({1, 2}), json::array({json::array({1, 2})}), 0));
  CHECK_FALSE(code::values_match(json::array({1, 2}), json::array({2, 1}), 0));
  CHECK_FALSE(code::values_match(json("3"), json(3), 0));
  CHECK_FALSE(code::values_match(json(0.1 + 0.2), json(0.3), 0));
  CHECK(code::values_match(json(0.1 + 0.2), json(0.3), 1e-9));
  CHECK(code::values_match(json::array({0.1 + 0.2, "a"}), json::array({0.3, "a"}), 1e-9));
  CHECK(code::values_match(json{{"a", 1}}, json{{"a", 1}}, 0));
  CHECK_FALSE(code::values_match(json{{"a", 1}}, json{{"a", 1}, {"b", 2}}, 0));
}

TEST_CASE("code judge: the code is the last python block", "[env][code]") {
  CHECK(code::extract_code("text\n```python\nprint(1)\n```\nmore\n```python\nprint(2)\n```\nend") == "print(2)\n");
  CHECK(code::extract_code("```python\nprint(1)\n```\n```\nplain\n```") == "print(1)\n");  // a tagged block wins
  CHECK(code::extract_code("```py\nx = 1\n```") == "x = 1\n");
  CHECK(code::extract_code("```\nx = 2\n```") == "x = 2\n");
  CHECK(code::extract_code("```cpp\nint x;\n```\n```python\ny = 3\n") == "y = 3\n");  // open at the end
  CHECK(code::extract_code("print(4)") == "print(4)");
}

TEST_CASE("code judge: case selection is bounded and deterministic", "[env][code]") {
  CHECK(code::select_cases(3, 16, code::CaseSelection::sample, 1) == std::vector<size_t>{0, 1, 2});
  CHECK(code::select_cases(100, 4, code::CaseSelection::first, 1) == std::vector<size_t>{0, 1, 2, 3});
  const auto a = code::select_cases(100, 10, code::CaseSelection::sample, 7);
  CHECK(a == code::select_cases(100, 10, code::CaseSelection::sample, 7));
  CHECK(a != code::select_cases(100, 10, code::CaseSelection::sample, 8));
  REQUIRE(a.size() == 10);
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(std::set<size_t>(a.begin(), a.end()).size() == 10);
  CHECK(a.back() < 100);
  CHECK(a != code::select_cases(100, 10, code::CaseSelection::first, 7));
}

TEST_CASE("code judge: tests as APPS writes them, and errors that name the field", "[env][code]") {
  const auto s = code::TestSpec::from_json(json(kSum.dump()), "t");  // APPS: a JSON string
  REQUIRE(s.cases.size() == 3);
  CHECK(s.cases[1].input == "-5 5\n");
  CHECK(s.fn_name.empty());
  const auto lines = code::TestSpec::from_json(
      json{{"inputs", json::array({json::array({"1", "2"})})}, {"outputs", json::array({json::array({"3"})})}}, "t");
  CHECK(lines.cases[0].input == "1\n2\n");
  CHECK(lines.cases[0].output == "3\n");
  const auto call = code::TestSpec::from_json(json{{"fn_name", "f"}, {"inputs", json::array({json::array({1, 2}), "[3]\n4"})}, {"outputs", json::array({json::array({3}), "7"})}}, "t");
  CHECK(call.cases[0].input == "[1,2]");
  CHECK(call.cases[1].input == "[[3],4]");  // LiveCodeBench: one JSON argument per line
  CHECK(call.cases[1].output == "7");
  CHECK(code::TestSpec::from_json(call.to_json(), "t").cases[1].input == "[[3],4]");
  CHECK_THROWS_WITH(code::TestSpec::from_json(json{{"inputs", json::array({"1"})}}, "f.jsonl:4"),
                    Catch::Contains("f.jsonl:4") && Catch::Contains("'outputs'"));
  CHECK_THROWS_WITH(code::TestSpec::from_json(json{{"inputs", {"1", "2"}}, {"outputs", json::array({"1"})}}, "x"),
                    Catch::Contains("1 outputs for 2 inputs"));
  CHECK_THROWS_WITH(code::TestSpec::from_json(json("{oops"), "x"), Catch::Contains("'input_output'"));
  CHECK_THROWS_WITH(code::TestSpec::from_json(json{{"inputs", json::array({1})}, {"outputs", json::array({"1"})}}, "x"), Catch::Contains("'inputs[0]'"));
  CHECK_THROWS_WITH(code::TestSpec::from_json(json{{"inputs", json::array()}, {"outputs", json::array()}}, "x"),
                    Catch::Contains("no test cases"));
  CHECK_THROWS_WITH(code::TestSpec::from_json(json{{"fn_name", 3}, {"inputs", json::array({"1"})}, {"outputs", json::array({"1"})}}, "x"),
                    Catch::Contains("'fn_name'"));
  CHECK_THROWS_WITH(code::JudgeOptions::from_json(json{{"reward", "most"}}), Catch::Contains("reward"));
  CHECK_THROWS_WITH(code::JudgeOptions::from_json(json{{"time_limit_s", -1}}), Catch::Contains("time_limit_s"));
  CHECK(code::JudgeOptions::from_json(json{{"reward", "fraction"}}).reward == code::RewardMode::fraction);
}

TEST_CASE("code judge: real programs in the sandbox, one run per case", "[env][code][sandbox]") {
  SECTION("a right program passes every case") {
    const auto j = run(kSumRight, kSum);
    CHECK(j.reward == 1);
    CHECK(j.passed == 3);
    CHECK(j.count(CaseVerdict::passed) == 3);
    CHECK(j.info()["solved"] == 1);
    CHECK(j.info()["cases_wrong_answer"] == 0);
  }
  SECTION("whitespace as judges allow it: trailing spaces, \\r\\n, no final newline") {
    CHECK(run("a, b = map(int, input().split())\nimport sys\nsys.stdout.write(str(a + b) + '   \\r\\n\\n')\n", kSum).reward == 1);
    CHECK(run("a, b = map(int, input().split())\nprint(a + b, end='')\n", kSum).reward == 1);
    CHECK(run("a, b = map(int, input().split())\nprint(' ' + str(a + b))\n", kSum).reward == 0);
  }
  SECTION("a wrong answer: all-or-nothing stops at the first failure; fraction counts every case") {
    const auto j = run("a, b = map(int, input().split())\nprint(a + b if a > 0 else 42)\n", kSum);
    CHECK(j.reward == 0);
    CHECK(j.count(CaseVerdict::passed) == 1);
    CHECK(j.count(CaseVerdict::wrong_answer) == 1);
    CHECK(j.count(CaseVerdict::not_run) == 1);
    CHECK(j.info()["verdicts"] == json{"passed", "wrong_answer", "not_run"});
    code::JudgeOptions o;
    o.reward = code::RewardMode::fraction;
    const auto f = run("a, b = map(int, input().split())\nprint(a + b if a > 0 else 42)\n", kSum, o);
    CHECK(f.reward == Approx(2.0 / 3));
    CHECK(f.count(CaseVerdict::wrong_answer) == 1);
    CHECK(f.count(CaseVerdict::not_run) == 0);
  }
  SECTION("an endless loop hits the time limit, within a bound") {
    code::JudgeOptions o;
    o.reward = code::RewardMode::fraction;
    o.time_limit_s = 0.5;
    const double t0 = rlx::now_s();
    const auto j = run("while True:\n    pass\n", kSum, o);
    const double wall = rlx::now_s() - t0;
    CHECK(j.count(CaseVerdict::time_limit) == 3);
    CHECK(j.reward == 0);
    CHECK(wall < 3 * 0.5 + 3.0);  // three limits and the sandbox's start-up, not the sandbox's 20 s
    for (const auto& c : j.cases) CHECK(c.wall_s < 1.5);
  }
  SECTION("the time budget of a problem ends it: what is left is not run") {
    code::JudgeOptions o;
    o.reward = code::RewardMode::fraction;
    o.time_limit_s = 1;
    o.time_budget_s = 1.5;
    const double t0 = rlx::now_s();
    const auto j = run("while True:\n    pass\n", kSum, o);
    CHECK(rlx::now_s() - t0 < 1.5 + 2.0);
    CHECK(j.budget_exhausted);
    CHECK(j.count(CaseVerdict::time_limit) == 2);  // the second one cut to the half second left
    CHECK(j.count(CaseVerdict::not_run) == 1);
    CHECK(j.info()["budget_exhausted"] == 1);
  }
  SECTION("a crash is a runtime error, with the exception named") {
    const auto j = run("a, b = map(int, input().split())\nprint(a // 0)\n", kSum);
    CHECK(j.count(CaseVerdict::runtime_error) == 1);
    CHECK_THAT(j.cases[0].detail, Catch::Contains("ZeroDivisionError"));
    CHECK(j.info()["first_failure"]["verdict"] == "runtime_error");
    CHECK(run("import os\nos.kill(os.getpid(), 11)\n", kSum).count(CaseVerdict::runtime_error) == 1);
    CHECK(run("print(3\n", kSum).count(CaseVerdict::runtime_error) == 1);  // a syntax error
  }
  SECTION("a flood of output is cut at the output limit") {
    code::JudgeOptions o;
    o.output_bytes = 4096;
    const double t0 = rlx::now_s();
    const auto j = run("while True:\n    print('x' * 1000)\n", kSum, o);
    CHECK(j.count(CaseVerdict::output_limit) == 1);
    CHECK(rlx::now_s() - t0 < 5);
    // The limit grows with the expected output: a long right answer is not cut.
    const std::string big(20000, '7');
    CHECK(run("print('7' * 20000)\n", json{{"inputs", json::array({""})}, {"outputs", json::array({big + "\n"})}}, o).reward == 1);
  }
  SECTION("too much memory is a memory limit") {
    code::JudgeOptions o;
    o.memory_mb = 256;
    const auto j = run("x = bytearray(1 << 30)\nprint(len(x))\n", kSum, o);
    CHECK(j.count(CaseVerdict::memory_limit) == 1);
  }
  SECTION("call-based cases: a function or Solution().method, results compared outside") {
    const json io = {{"fn_name", "add"},
                    {"inputs", json::array({json::array({1, 2}), json::array({-1, 1})})},
                    {"outputs", json::array({json::array({3}), json::array({0})})}};
    CHECK(run("def add(a, b):\n    return a + b\n", io).reward == 1);
    CHECK(run("class Solution:\n    def add(self, a, b):\n        return a + b\n", io).reward == 1);
    const auto wrong = run("def add(a, b):\n    print(a + b)\n    return a - b\n", io);
    CHECK(wrong.count(CaseVerdict::wrong_answer) == 1);
    const auto raised = run("def add(a, b):\n    raise ValueError('no')\n", io);
    CHECK(raised.count(CaseVerdict::runtime_error) == 1);
    CHECK(raised.cases[0].detail == "ValueError");
    // Leaving before the call returns, or printing a guess of the tag, scores nothing.
    CHECK(run("import os\nos._exit(0)\n", io).count(CaseVerdict::runtime_error) == 1);
    CHECK(run("def add(a, b):\n    import os\n    os.write(1, b'@@rlx 0 ok 3\\n')\n    os._exit(0)\n", io).reward == 0);
    CHECK(run("def add(a, b):\n    return (a + b,)\n", io).reward == 1);  // a tuple is a list in JSON, [3] wraps 3
  }
}

namespace {

rlx::env::Registry& registry() { return rlx::test::bundled_registry(); }

std::unique_ptr<rlx::env::Env> make_env(const rlx::env::Sandbox& sandbox, json options = json::object()) {
  return registry().make("python_code", {.tokenizer = &rlx::test::gpt2(), .sandbox = &sandbox, .options = std::move(options)});
}

json apps_task(const std::string& reward = "") {
  json t = {{"question", "Read a and b; print a + b."}, {"input_output", kSum.dump()}};
  if (!reward.empty()) t["reward"] = reward;
  return t;
}

}  // namespace

TEST_CASE("python_code: APPS-style tasks, verdict counters, options and task files", "[env][code][sandbox]") {
  const rlx::env::Sandbox sandbox({.limits = {.wall_s = 20}});
  auto env = make_env(sandbox);
  const auto score = [&](rlx::env::Env& e, const json& task, const std::string& completion) {
    CHECK(rlx::test::gpt2().decode(e.reset(task)) == task.value("question", task.value("prompt", std::string())));
    return e.step(rlx::test::gpt2().encode(completion));
  };
  auto r = score(*env, apps_task(), "Draft:\n```python\nprint(0)\n```\nFinal:\n```python\n" + std::string(kSumRight) + "```\n");
  CHECK(r.done);
  CHECK(r.reward == 1);
  CHECK(r.info["cases_passed"] == 3);
  for (const char* key : {"cases_wrong_answer", "cases_time_limit", "cases_runtime_error", "cases_output_limit", "solved"})
    CHECK(r.info.at(key).is_number());
  // The task's own reward mode beats the option's; the option beats the default.
  const std::string half = "```python\na, b = map(int, input().split())\nprint(a + b if a > 0 else 1)\n```";
  CHECK(score(*env, apps_task(), half).reward == 0);
  CHECK(score(*env, apps_task("fraction"), half).reward == Approx(2.0 / 3));
  auto fraction = make_env(sandbox, {{"reward", "fraction"}, {"max_cases", 2}});
  r = score(*fraction, apps_task(), half);
  CHECK(r.reward == Approx(0.5));  // the first 2 of 3 cases
  CHECK(r.info["cases_available"] == 3);
  CHECK(r.info["total"] == 2);
  // DeepCoder's list of {input, output}.
  const json deep = {{"prompt", "sum"}, {"tests", json::array({json{{"input", "2 2\n"}, {"output", "4\n"}}})}};
  env->reset(deep);
  CHECK(env->step(rlx::test::gpt2().encode(kSumRight)).reward == 1);
  // A checkpointed episode continues elsewhere.
  env->reset(apps_task());
  const auto state = env->save_state();
  auto other = make_env(sandbox);
  other->load_state(state);
  CHECK(other->step(rlx::test::gpt2().encode(kSumRight)).reward == 1);
  // Built-in tasks of both kinds score.
  CHECK(score(*env, registry().generate("python_code", 0, 4), std::string("```python\n") + kSumRight + "```").reward == 1);
  CHECK_THROWS_WITH(make_env(sandbox, {{"max_case", 3}}), Catch::Contains("max_case") && Catch::Contains("max_cases"));
  CHECK_THROWS_WITH(env->reset(json{{"prompt", "x"}}), Catch::Contains("'input_output'"));
}

TEST_CASE("python_code: a task file's bad line is refused, naming the line and the field", "[env][code]") {
  rlx::test::TempDir tmp;
  const auto path = tmp.path / "problems.jsonl";
  const json good = apps_task();
  rlx::test::write_file(path, good.dump() + "\n\n" + json{{"question", "q"}, {"input_output", json{{"inputs", json::array({"1"})}}}}.dump() + "\n");
  const json options = {{"data", path.string()}};
  CHECK_THROWS_WITH(registry().generate("python_code", 0, 0, options),
                    Catch::Contains(path.string() + ":3") && Catch::Contains("'outputs'"));
  rlx::test::write_file(path, good.dump() + "\n{\"question\": 3, \"input_output\": {}}\n");
  CHECK_THROWS_WITH(registry().generate("python_code", 0, 0, options),
                    Catch::Contains(path.string() + ":2") && Catch::Contains("'question'"));
  rlx::test::write_file(path, good.dump() + "\n{oops\n" + good.dump() + "\n");
  CHECK_THROWS_WITH(registry().generate("python_code", 0, 0, options), Catch::Contains(path.string() + ":2"));
  // strict: false skips the bad line.
  const json lenient = {{"data", path.string()}, {"strict", false}};
  CHECK(registry().generate("python_code", 0, 1, lenient) == good);
  // A record past the line limit (16 MiB) is named, not parsed.
  rlx::test::write_file(path, good.dump() + "\n\"" + std::string((size_t{16} << 20) + 1, 'x') + "\"\n");
  CHECK_THROWS_WITH(registry().generate("python_code", 0, 0, options),
                    Catch::Contains(path.string() + ":2: a record longer than"));
}

TEST_CASE("python_code: rlx env score python_code prints a line per response and names bad lines", "[env][code][cli]") {
  rlx::test::TempDir tmp;
  const auto input = tmp.path / "responses.jsonl";
  json right = apps_task(), wrong = apps_task(), loop = apps_task();
  right["response"] = std::string("```python\n") + kSumRight + "```";
  wrong["response"] = "print(3)";
  loop["response"] = "while True: pass";
  rlx::test::write_file(input, right.dump() + "\n" + wrong.dump() + "\n" + json{{"question", "q"}, {"response", "x"}}.dump() +
                                   "\n" + loop.dump() + "\n");
  const auto err = tmp.path / "stderr.txt";
  const std::string cmd = std::string(rlx::test_paths::kCli) + " env score python_code --input " + input.string() +
                          " --option time_limit_s=0.5 --option reward=fraction 2> " + err.string();
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  std::vector<json> lines;
  char buf[65536];
  while (std::fgets(buf, sizeof buf, pipe)) lines.push_back(json::parse(buf));
  const int status = ::pclose(pipe);
  CHECK(WEXITSTATUS(status) == 1);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["reward"] == 1);
  CHECK(lines[0]["line"] == 1);
  CHECK(lines[1]["reward"] == Approx(1.0 / 3));  // "3" is right for the first case only
  CHECK(lines[1]["verdicts"] == json{"passed", "wrong_answer", "wrong_answer"});
  CHECK(lines[2]["cases_time_limit"] == 3);
  CHECK(lines[2]["line"] == 4);
  std::ifstream in(err);
  const std::string errors((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(errors, Catch::Contains(input.string() + ":3") && Catch::Contains("'input_output'"));
}
