// Judging a program on test cases, as competitive-programming graders do (APPS, TACO,
// CodeContests, LiveCodeBench, DeepCoder): the program runs once per case in the sandbox,
// with the case's input on stdin and a time, memory and output limit of its own, and its
// stdout is compared with the expected output. Call-based problems (`fn_name`) call a
// function (or `Solution().fn_name`) with each case's arguments instead.
//
// The decisions (parsing a problem's tests, picking the cases, comparing outputs, the
// verdict of a run, the reward) are pure functions tested without processes; judge()
// only runs the cases.
//
//   auto tests = code::TestSpec::from_json(task.at("input_output"), "task");
//   code::JudgeOptions o;  // all-or-nothing, 2 s and 512 MiB per case, 16 cases at most
//   auto j = code::judge(sandbox, code::extract_code(completion), tests, o);
//   // j.reward == 1 when every case passed; j.counts[CaseVerdict::wrong_answer], ...
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlx::env {
class Sandbox;
}

namespace rlx::env::code {

enum class CaseVerdict { passed, wrong_answer, time_limit, memory_limit, runtime_error, output_limit, not_run };
constexpr std::array<std::pair<CaseVerdict, std::string_view>, 7> enum_names(CaseVerdict) {
  return {{{CaseVerdict::passed, "passed"},
           {CaseVerdict::wrong_answer, "wrong_answer"},
           {CaseVerdict::time_limit, "time_limit"},
           {CaseVerdict::memory_limit, "memory_limit"},
           {CaseVerdict::runtime_error, "runtime_error"},
           {CaseVerdict::output_limit, "output_limit"},
           {CaseVerdict::not_run, "not_run"}}};
}

enum class RewardMode { all_or_nothing, fraction };
constexpr std::array<std::pair<RewardMode, std::string_view>, 2> enum_names(RewardMode) {
  return {{{RewardMode::all_or_nothing, "all_or_nothing"}, {RewardMode::fraction, "fraction"}}};
}

enum class CaseSelection { first, sample };
constexpr std::array<std::pair<CaseSelection, std::string_view>, 2> enum_names(CaseSelection) {
  return {{{CaseSelection::first, "first"}, {CaseSelection::sample, "sample"}}};
}

// One case: stdin text and expected stdout, or (call-based) the arguments and the expected
// return value as JSON.
struct TestCase {
  std::string input, output;
};

struct TestSpec {
  std::vector<TestCase> cases;
  std::string fn_name;  // non-empty: call-based

  // `{"inputs": [...], "outputs": [...], "fn_name"?}`, or that object as a JSON string (APPS's
  // `input_output` field). An input or output given as a list of lines is joined with
  // newlines. Errors name `where` and the field.
  static TestSpec from_json(const nlohmann::json& io, std::string_view where);
  nlohmann::json to_json() const;
};

struct JudgeOptions {
  RewardMode reward = RewardMode::all_or_nothing;  // all_or_nothing stops at the first failed case
  double time_limit_s = 2;          // per case: wall clock and CPU (CPU rounded up to whole seconds)
  uint64_t memory_mb = 512;         // per case: address space
  uint64_t output_bytes = 1 << 20;  // per case: stdout (and stderr); at least twice the expected output
  size_t max_cases = 16;            // cases run per problem at most
  CaseSelection selection = CaseSelection::first;  // which, when a problem has more: the first, or a fixed sample
  double time_budget_s = 20;        // all cases of one problem; what is left is not run
  double float_tol = 0;             // > 0: numbers match within this absolute or relative tolerance
  std::string python = "python3";

  // From an environment's options (env.options.*); unknown keys are left to the caller.
  // Errors name the key and the accepted range.
  static JudgeOptions from_json(const nlohmann::json& options);
};

// The code of a completion: the last ```python (or ```py) block; else the last ``` block;
// else the whole text. A block left open at the end runs to the end.
std::string extract_code(std::string_view completion);

// stdout against the expected output: trailing whitespace of each line and trailing empty
// lines are ignored (\r\n reads as \n); with float_tol > 0, tokens that are both numbers
// match within it.
bool outputs_match(std::string_view got, std::string_view expected, double float_tol);

// A call's result against the expected value (JSON): equal, or the expected value is a
// one-element list holding it (APPS writes outputs so); numbers within float_tol.
bool values_match(const nlohmann::json& got, const nlohmann::json& expected, double float_tol);

// The indices of the cases to run, ascending: all when n <= max; else the first max, or a
// sample fixed by `seed` (the same problem gets the same cases every time).
std::vector<size_t> select_cases(size_t n, size_t max, CaseSelection selection, uint64_t seed);

// A fingerprint of the problem's tests (the seed of select_cases).
uint64_t spec_fingerprint(const TestSpec& spec);

struct CaseResult {
  size_t index = 0;  // in TestSpec::cases
  CaseVerdict verdict = CaseVerdict::not_run;
  double wall_s = 0;
  std::string detail;  // the sandbox's reason, or the first lines of stderr
};

struct Judgement {
  double reward = 0;
  size_t passed = 0;
  size_t selected = 0;   // cases chosen to run (<= max_cases)
  size_t available = 0;  // cases the problem has
  std::vector<CaseResult> cases;  // one per selected case, in order
  std::array<size_t, 7> counts{};  // per CaseVerdict
  double wall_s = 0;
  bool budget_exhausted = false;

  size_t count(CaseVerdict v) const { return counts[static_cast<size_t>(v)]; }
  // Numeric counters (they become env_* metrics) and the verdict of each case.
  nlohmann::json info() const;
};

// Runs the selected cases of `spec` on `code` in `sandbox`. A sandbox that could not run
// (setup_error) throws env::InfraError: never a zero reward.
Judgement judge(const Sandbox& sandbox, const std::string& code, const TestSpec& spec, const JudgeOptions& options,
                uint64_t nonce_seed = 0);

}  // namespace rlx::env::code
