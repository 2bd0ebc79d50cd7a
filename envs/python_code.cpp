// python_code: the model writes Python; tests run with python3 in the sandbox.
//
// Two kinds of task:
//  - function tests, {"prompt", "tests": [{"call": "add(2, 3)", "expect": "5"}, ...]}: `expect`
//    is the repr() of the right result. Only the calls go into the sandbox, in one run: the
//    harness evaluates each and prints the repr of what came back, tagged with a per-run
//    nonce; the comparison with `expect` happens here, outside. So a solution that exits
//    early (exit(0), os._exit(0), sys.exit(0)) scores only the tests that really ran before;
//    one that monkeypatches whatever it finds in the process cannot touch the checker; and
//    printing "passed", or guesses, scores nothing: a test whose index appears more than
//    once fails. The reward is the fraction passed.
//  - competitive-programming tests (APPS, TACO, CodeContests, LiveCodeBench, DeepCoder),
//    {"prompt" or "question", "input_output": {"inputs": [...], "outputs": [...], "fn_name"?}}
//    (the object or APPS's JSON string of it), or "tests": [{"input", "output"}, ...]: the
//    program runs once per case with its stdin, limits of its own and its stdout compared
//    (env/code_judge.hpp); with fn_name, the function (or Solution().fn_name) is called on
//    each case's arguments. Reward all-or-nothing (or the fraction, env.options.reward or
//    the task's "reward"); each case's verdict counted in the info (env_cases_* metrics).
// The code is the action's last ```python block (or the whole action).
// A sandbox that could not run (setup_error) throws env::InfraError: never a zero reward.
//
// env.options: python, reward, time_limit_s, memory_mb, output_bytes, max_cases,
// case_selection, time_budget_s, float_tol (code_judge.hpp's JudgeOptions); data (a JSONL
// file of tasks, checked line by line when loaded; the generator's tasks), strict (false:
// a bad line of `data` is skipped and counted instead of refused).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "common.hpp"
#include "rlx/core/config.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/log.hpp"
#include "rlx/env/code_judge.hpp"
#include "rlx/env/sandbox.hpp"

namespace rlx::envs {

namespace {

constexpr const char* kHarness = R"PY(import json, os, sys
# Everything the harness uses is bound before the solution runs (it may patch builtins).
_write, _repr, _eval, _type, _enc = os.write, repr, eval, type, str.encode
_nonce = sys.stdin.readline().strip()
_calls = json.loads(sys.stdin.readline())
_ns = {"__name__": "solution"}
try:
    with open("solution.py") as _f:
        exec(compile(_f.read(), "solution.py", "exec"), _ns)
except BaseException as _e:
    _write(1, _enc("\n@@rlx %s load !%s\n" % (_nonce, _type(_e).__name__)))
for _i, _call in enumerate(_calls):
    try:
        _line = "\n@@rlx %s %d %s\n" % (_nonce, _i, _repr(_eval(_call, _ns)))
    except BaseException as _e:
        _line = "\n@@rlx %s %d !%s\n" % (_nonce, _i, _type(_e).__name__)
    _write(1, _enc(_line))
)PY";

using json = nlohmann::json;
namespace code = env::code;

const std::vector<std::string> kCodeOptionNames = {"python",        "reward", "time_limit_s",   "memory_mb",
                                               "output_bytes",  "max_cases", "case_selection", "time_budget_s",
                                               "float_tol",     "data",   "strict"};


struct Test {
  std::string call, expect;
};

// One task, read and checked: function tests, or cases for the judge.
struct CodeTask {
  std::string prompt;
  std::vector<Test> tests;         // function tests
  code::TestSpec cases;            // judged cases (when `tests` is empty)
  std::optional<code::RewardMode> reward;  // the task's own "reward"
  std::optional<double> time_limit_s;      // the task's own per-case limit
};

CodeTask read_code_task(const json& task, std::string_view where) {
  RLX_CHECK(task.is_object(), "{}: a task must be a JSON object, got {}", where, task.type_name());
  CodeTask t;
  const char* prompt_key = task.contains("prompt") ? "prompt" : "question";
  RLX_CHECK(task.contains(prompt_key), "{}: field 'prompt' (or 'question') is missing", where);
  RLX_CHECK(task.at(prompt_key).is_string(), "{}: field '{}': expected text, got {}", where, prompt_key,
            task.at(prompt_key).type_name());
  t.prompt = task.at(prompt_key).get<std::string>();
  if (task.contains("input_output")) {
    t.cases = code::TestSpec::from_json(task.at("input_output"), where);
  } else {
    RLX_CHECK(task.contains("tests"), "{}: field 'input_output' (or 'tests') is missing", where);
    const json& tests = task.at("tests");
    RLX_CHECK(tests.is_array() && !tests.empty(), "{}: field 'tests': expected a non-empty list, got {}", where,
              tests.type_name());
    if (tests[0].is_object() && tests[0].contains("call")) {
      for (size_t i = 0; i < tests.size(); ++i) {
        const auto& x = tests[i];
        RLX_CHECK(x.is_object() && x.contains("call") && x.at("call").is_string() && x.contains("expect") &&
                      x.at("expect").is_string(),
                  "{}: field 'tests[{}]': expected {{\"call\": text, \"expect\": text}}", where, i);
        t.tests.push_back({x.at("call").get<std::string>(), x.at("expect").get<std::string>()});
      }
    } else {
      json io = {{"inputs", json::array()}, {"outputs", json::array()}};
      for (size_t i = 0; i < tests.size(); ++i) {
        const auto& x = tests[i];
        RLX_CHECK(x.is_object() && x.contains("input") && x.contains("output"),
                  "{}: field 'tests[{}]': expected {{\"input\", \"output\"}} (or {{\"call\", \"expect\"}})", where, i);
        io["inputs"].push_back(x.at("input"));
        io["outputs"].push_back(x.at("output"));
      }
      if (task.contains("fn_name")) io["fn_name"] = task.at("fn_name");
      t.cases = code::TestSpec::from_json(io, where);
    }
  }
  if (task.contains("reward")) {
    RLX_CHECK(task.at("reward").is_string(), "{}: field 'reward': expected all_or_nothing or fraction", where);
    t.reward = config::parse_enum<code::RewardMode>(task.at("reward").get<std::string>(), fmt::format("{}: field 'reward'", where));
  }
  if (task.contains("time_limit_s")) {
    const auto& v = task.at("time_limit_s");
    RLX_CHECK(v.is_number() && v.get<double>() > 0 && v.get<double>() <= 3600,
              "{}: field 'time_limit_s': expected seconds in (0, 3600], got {}", where, v.dump());
    t.time_limit_s = v.get<double>();
  }
  return t;
}

class PythonCode final : public TextEnv {
 public:
  explicit PythonCode(const env::Context& c) : TextEnv(c) {
    RLX_CHECK(c.sandbox, "python_code: needs a sandbox (Context::sandbox)");
    envs::check_option_names("python_code", c.options, kCodeOptionNames);
    judge_ = code::JudgeOptions::from_json(c.options);
  }

  std::vector<TokenId> reset(const json& task) override {
    task_ = read_code_task(task, "python_code task");
    raw_ = task;
    done_ = false;
    return encode(task_.prompt);
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "python_code: step() after the episode ended");
    done_ = true;
    const std::string code = code::extract_code(decode(action));
    if (task_.tests.empty()) return judge_cases(code);
    // A nonce per run, so that harness lines are told apart from the solution's prints.
    const std::string nonce = fmt::format("{:016x}", RngStream(ctx_.seed, runs_++).fork("python_code").next_u64() ^
                                                         std::hash<std::string>{}(code));
    json calls = json::array();
    for (const auto& t : task_.tests) calls.push_back(t.call);
    env::SandboxRequest req{.argv = {judge_.python, "harness.py"},
                       .stdin_data = nonce + "\n" + calls.dump() + "\n",
                       .files = {{"harness.py", kHarness}, {"solution.py", code}}};
    const env::SandboxResult res = ctx_.sandbox->run(req);
    if (res.verdict == env::SandboxVerdict::setup_error)
      throw env::InfraError(fmt::format("python_code: the sandbox failed: {}", res.detail));
    // Harness lines: "@@rlx NONCE INDEX REPR".
    std::map<size_t, std::string> got;
    std::set<size_t> repeated;
    const std::string tag = "@@rlx " + nonce + " ";
    for (size_t pos = 0; (pos = res.stdout_text.find(tag, pos)) != std::string::npos;) {
      const size_t start = pos + tag.size();
      size_t end = res.stdout_text.find('\n', start);
      if (end == std::string::npos) end = res.stdout_text.size();
      const std::string line = res.stdout_text.substr(start, end - start);
      pos = end;
      const auto sp = line.find(' ');
      if (sp == std::string::npos || line.compare(0, sp, "load") == 0) continue;
      size_t index = 0;
      try {
        index = std::stoul(line.substr(0, sp));
      } catch (...) {
        continue;
      }
      if (!got.emplace(index, line.substr(sp + 1)).second) repeated.insert(index);
    }
    size_t passed = 0;
    for (size_t i = 0; i < task_.tests.size(); ++i)
      if (!repeated.count(i) && got.count(i) && got[i] == task_.tests[i].expect) ++passed;
    env::StepResult r;
    r.done = true;
    r.reward = static_cast<double>(passed) / static_cast<double>(task_.tests.size());
    r.info = {{"passed", passed},
              {"total", task_.tests.size()},
              {"verdict", std::string(config::enum_to_string(res.verdict))},
              {"exit_code", res.exit_code},
              {"wall_s", res.wall_s}};
    return r;
  }

  std::string save_state() const override { return json{{"task", raw_}, {"done", done_}, {"runs", runs_}}.dump(); }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "python_code");
    raw_ = field<json>(j, "task", "python_code state");
    task_ = read_code_task(raw_, "python_code state");
    done_ = field<bool>(j, "done", "python_code state");
    runs_ = field<uint64_t>(j, "runs", "python_code state");
  }

 private:
  env::StepResult judge_cases(const std::string& code) {
    code::JudgeOptions o = judge_;
    if (task_.reward) o.reward = *task_.reward;
    if (task_.time_limit_s) o.time_limit_s = *task_.time_limit_s;
    const auto j = code::judge(*ctx_.sandbox, code, task_.cases, o, ctx_.seed ^ runs_++);
    env::StepResult r;
    r.done = true;
    r.reward = j.reward;
    r.info = j.info();
    return r;
  }

  code::JudgeOptions judge_;
  CodeTask task_;
  json raw_;
  bool done_ = false;
  uint64_t runs_ = 0;
};

// A few built-in problems (a dataset is the real source); index picks one. With
// env.options.data, its tasks in order.
json generate_python_code_task(uint64_t, uint64_t index, const json& o) {
  envs::check_option_names("python_code", o, kCodeOptionNames);
  if (o.contains("data")) {
    RLX_CHECK(o.at("data").is_string(), "python_code option 'data': expected a path");
    const auto file = envs::read_task_file(
        "python_code", o.at("data").get<std::string>(), envs::strict_option("python_code", o, true), "",
        [](const json& task, const std::string& where) { (void)read_code_task(task, where); });
    return file->tasks[index % file->tasks.size()];
  }
  static const nlohmann::json problems = nlohmann::json::parse(R"JSON([
    {"prompt": "Write a Python function add(a, b) that returns a + b.\n",
     "tests": [{"call": "add(2, 3)", "expect": "5"}, {"call": "add(-1, 1)", "expect": "0"}, {"call": "add(10**12, 1)", "expect": "1000000000001"}]},
    {"prompt": "Write a Python function reverse(s) that returns the string s reversed.\n",
     "tests": [{"call": "reverse('abc')", "expect": "'cba'"}, {"call": "reverse('')", "expect": "''"}, {"call": "reverse('ab ba!')", "expect": "'!ab ba'"}]},
    {"prompt": "Write a Python function fib(n) returning the n-th Fibonacci number (fib(0) = 0, fib(1) = 1).\n",
     "tests": [{"call": "fib(0)", "expect": "0"}, {"call": "fib(1)", "expect": "1"}, {"call": "fib(10)", "expect": "55"}, {"call": "fib(50)", "expect": "12586269025"}]},
    {"prompt": "Write a Python function is_prime(n) that returns True when n is a prime number.\n",
     "tests": [{"call": "is_prime(2)", "expect": "True"}, {"call": "is_prime(1)", "expect": "False"}, {"call": "is_prime(97)", "expect": "True"}, {"call": "is_prime(91)", "expect": "False"}]},
    {"prompt": "Read two integers a and b from standard input and print a + b.\n",
     "input_output": {"inputs": ["1 2\n", "-5 5\n", "1000000000000 1\n"], "outputs": ["3\n", "0\n", "1000000000001\n"]}},
    {"prompt": "Write a Python function count_vowels(s) returning how many of the letters of s are vowels (aeiou, any case).\n",
     "input_output": {"fn_name": "count_vowels", "inputs": [["hello"], [""], ["AEIOUxyz"]], "outputs": [[2], [0], [5]]}}
  ])JSON");
  return problems[index % problems.size()];
}

}  // namespace

void register_python_code(env::Registry& r) {
  r.add("python_code",
        "write Python; function tests or stdin/stdout cases (APPS, TACO, CodeContests) run in the sandbox "
        "(options: data, reward, time_limit_s, memory_mb, max_cases, case_selection, time_budget_s, float_tol, python)",
        [](const env::Context& c) { return std::make_unique<PythonCode>(c); }, generate_python_code_task, {.runs_code = true});
}

}  // namespace rlx::envs
