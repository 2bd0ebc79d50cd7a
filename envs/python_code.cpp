// python_code: the model writes a Python function; hidden tests run with python3 in the
// sandbox; the reward is the fraction passed.
//
// Task: {"prompt": ..., "tests": [{"call": "add(2, 3)", "expect": "5"}, ...]} where
// `expect` is the repr() of the right result. Only the calls go into the sandbox: the
// harness evaluates each and prints the repr of what came back, tagged with a per-run
// nonce; the comparison with `expect` happens here, outside. So a solution that exits
// early (exit(0), os._exit(0), sys.exit(0)) scores only the tests that really ran before;
// one that monkeypatches whatever it finds in the process cannot touch the checker; and
// printing "passed", or guesses, scores nothing: a test whose index appears more than
// once fails.
// The code is the action's first ```python block (or the whole action).
// A sandbox that could not run (setup_error) throws env::InfraError: never a zero reward.
#include <set>

#include "common.hpp"
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

struct Test {
  std::string call, expect;
};

class PythonCode final : public TextEnv {
 public:
  explicit PythonCode(const env::Context& c) : TextEnv(c) {
    RLX_CHECK(c.sandbox, "python_code: needs a sandbox (Context::sandbox)");
    python_ = option<std::string>("python", "python3");
  }

  std::vector<TokenId> reset(const nlohmann::json& task) override {
    tests_.clear();
    for (const auto& t : field<nlohmann::json>(task, "tests", "python_code task"))
      tests_.push_back({field<std::string>(t, "call", "python_code test"), field<std::string>(t, "expect", "python_code test")});
    RLX_CHECK(!tests_.empty(), "python_code task: no tests");
    done_ = false;
    return encode(field<std::string>(task, "prompt", "python_code task"));
  }

  static std::string extract_code(const std::string& text) {
    for (const char* fence : {"```python\n", "```py\n", "```\n"}) {
      const auto open = text.find(fence);
      if (open == std::string::npos) continue;
      const auto start = open + std::strlen(fence);
      const auto close = text.find("```", start);
      return text.substr(start, close == std::string::npos ? std::string::npos : close - start);
    }
    return text;
  }

  env::StepResult step(std::span<const TokenId> action) override {
    RLX_CHECK(!done_, "python_code: step() after the episode ended");
    done_ = true;
    const std::string code = extract_code(decode(action));
    // A nonce per run, so that harness lines are told apart from the solution's prints.
    const std::string nonce = fmt::format("{:016x}", RngStream(ctx_.seed, runs_++).fork("python_code").next_u64() ^
                                                         std::hash<std::string>{}(code));
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& t : tests_) calls.push_back(t.call);
    SandboxRequest req{.argv = {python_, "harness.py"},
                       .stdin_data = nonce + "\n" + calls.dump() + "\n",
                       .files = {{"harness.py", kHarness}, {"solution.py", code}}};
    const SandboxResult res = ctx_.sandbox->run(req);
    if (res.verdict == SandboxVerdict::setup_error)
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
    for (size_t i = 0; i < tests_.size(); ++i)
      if (!repeated.count(i) && got.count(i) && got[i] == tests_[i].expect) ++passed;
    env::StepResult r;
    r.done = true;
    r.reward = static_cast<double>(passed) / static_cast<double>(tests_.size());
    r.info = {{"passed", passed},
              {"total", tests_.size()},
              {"verdict", std::string(config::enum_to_string(res.verdict))},
              {"exit_code", res.exit_code},
              {"wall_s", res.wall_s}};
    return r;
  }

  std::string save_state() const override {
    nlohmann::json tests = nlohmann::json::array();
    for (const auto& t : tests_) tests.push_back({{"call", t.call}, {"expect", t.expect}});
    return nlohmann::json{{"tests", tests}, {"done", done_}, {"runs", runs_}}.dump();
  }
  void load_state(std::string_view s) override {
    const auto j = parse_state(s, "python_code");
    tests_.clear();
    for (const auto& t : field<nlohmann::json>(j, "tests", "python_code state"))
      tests_.push_back({field<std::string>(t, "call", "python_code state"), field<std::string>(t, "expect", "python_code state")});
    done_ = field<bool>(j, "done", "python_code state");
    runs_ = field<uint64_t>(j, "runs", "python_code state");
  }

 private:
  std::string python_;
  std::vector<Test> tests_;
  bool done_ = false;
  uint64_t runs_ = 0;
};

// A few built-in problems (a dataset is the real source); index picks one.
nlohmann::json generate_python_code_task(uint64_t, uint64_t index, const nlohmann::json&) {
  static const nlohmann::json problems = nlohmann::json::parse(R"JSON([
    {"prompt": "Write a Python function add(a, b) that returns a + b.\n",
     "tests": [{"call": "add(2, 3)", "expect": "5"}, {"call": "add(-1, 1)", "expect": "0"}, {"call": "add(10**12, 1)", "expect": "1000000000001"}]},
    {"prompt": "Write a Python function reverse(s) that returns the string s reversed.\n",
     "tests": [{"call": "reverse('abc')", "expect": "'cba'"}, {"call": "reverse('')", "expect": "''"}, {"call": "reverse('ab ba!')", "expect": "'!ab ba'"}]},
    {"prompt": "Write a Python function fib(n) returning the n-th Fibonacci number (fib(0) = 0, fib(1) = 1).\n",
     "tests": [{"call": "fib(0)", "expect": "0"}, {"call": "fib(1)", "expect": "1"}, {"call": "fib(10)", "expect": "55"}, {"call": "fib(50)", "expect": "12586269025"}]},
    {"prompt": "Write a Python function is_prime(n) that returns True when n is a prime number.\n",
     "tests": [{"call": "is_prime(2)", "expect": "True"}, {"call": "is_prime(1)", "expect": "False"}, {"call": "is_prime(97)", "expect": "True"}, {"call": "is_prime(91)", "expect": "False"}]}
  ])JSON");
  return problems[index % problems.size()];
}

}  // namespace

void register_python_code(env::Registry& r) {
  r.add("python_code", "write a Python function; hidden tests run in the sandbox; reward = fraction passed (options: python)",
        [](const env::Context& c) { return std::make_unique<PythonCode>(c); }, generate_python_code_task, {.runs_code = true});
}

}  // namespace rlx::envs
