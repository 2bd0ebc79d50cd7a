// Whether a model's final answer equals a reference answer, as a math grader decides it
// (the `math` environment's checker; envs/math.cpp, docs/MATH.md):
//  - numbers: 1,234 / 0.5 / 1/2 / \frac12 / \dfrac{1}{2} / 50% / 2.5e-3 / Unicode minus,
//    compared with a relative tolerance;
//  - LaTeX noise: $, \left \right, \! \, spacing, \text{...}, \mathrm{...}, degrees,
//    trailing units ("12 cm", "5 dollars");
//  - \sqrt, \pi, powers, tuples (ordered), intervals (brackets count), sets and bare lists
//    (any order), `x = 3` against `3`, equations, `a \pm b`;
//  - expressions with variables: equal at random points (rlx's own parser), under a
//    bound on size, depth and time for each check.
//
//   using namespace rlx::env::math;
//   check_equal("\\frac{\\sqrt{2}}{2}", "1/\\sqrt2").verdict;   // Verdict::equal
//   check_equal("(1, 2]", "(1, 2)").verdict;                    // Verdict::different
//   check_equal("\\frac{1}{", "0.5").verdict;                   // Verdict::unparsed
//
// `unparsed` and `limit` mean the checker could not decide: a caller scores them 0 and
// counts them (a checker failure is never a silent wrong answer).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>

namespace rlx::env::math {

struct VerifyOptions {
  double rel_tol = 1e-6;      // numbers equal within this relative difference (plus 1e-12 absolute)
  double time_limit_s = 1.0;  // one check's time bound (parse and evaluation)
  size_t max_chars = 1000;    // a longer answer is not read (Verdict::limit)
  size_t max_nodes = 1000;    // nodes of one expression's tree
  int points = 6;             // random points at which expressions with variables must agree
};

enum class Verdict {
  equal,      // the same value (or the same text)
  different,  // read on both sides, and not the same
  unparsed,   // one side could not be read, and the texts differ
  limit,      // a bound of the check (size, depth, time) was reached
};

constexpr std::array<std::pair<Verdict, std::string_view>, 4> enum_names(Verdict) {
  return {{{Verdict::equal, "equal"},
           {Verdict::different, "different"},
           {Verdict::unparsed, "unparsed"},
           {Verdict::limit, "limit"}}};
}

struct Check {
  Verdict verdict = Verdict::unparsed;
  std::string detail;  // why, for unparsed and limit ("the word 'foo' at 3")
};

// Never throws for any input: what cannot be read is a verdict.
Check check_equal(std::string_view answer, std::string_view reference, const VerifyOptions& options = {});

}  // namespace rlx::env::math
