// The final answer in a model's response, the final answer in a dataset's reference, and
// the response's score: what the `math` environment (envs/math.cpp) and `rlx env score
// math` compute. Equivalence itself is math_verify.hpp.
//
//   using namespace rlx::env::math;
//   extract_answer("... so $x = \\boxed{\\frac{3}{4}}$.")->text;   // "\\frac{3}{4}"
//   reference_answer("Natalia sold 48/2 = 24 clips ... #### 72");   // "72"
//   Score s = score_response("The answer is 0.75.", "\\frac34");
//   // s.reward == 1, s.outcome == Outcome::correct, s.extracted->by == Extractor::answer_is
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlx/env/math_verify.hpp"

namespace rlx::env::math {

enum class Extractor {
  boxed,        // the last \boxed{...} or \fbox{...} (nested braces)
  hash,         // the text after the last "####" on its line (GSM8K)
  answer_is,    // after the last "answer is" / "answer:", to the end of its sentence
  last_number,  // the last number written (1,234.5, -3, 3/4)
};

constexpr std::array<std::pair<Extractor, std::string_view>, 4> enum_names(Extractor) {
  return {{{Extractor::boxed, "boxed"},
           {Extractor::hash, "hash"},
           {Extractor::answer_is, "answer_is"},
           {Extractor::last_number, "last_number"}}};
}

inline constexpr std::array<Extractor, 4> kAllExtractors = {Extractor::boxed, Extractor::hash, Extractor::answer_is,
                                                            Extractor::last_number};

struct Extracted {
  std::string text;
  Extractor by = Extractor::boxed;
};

// The answer the first extractor of `order` finds, or nullopt when none finds one.
std::optional<Extracted> extract_answer(std::string_view response, std::span<const Extractor> order = kAllExtractors);

// A dataset's reference as a final answer: after "####" (GSM8K's answer field), else the
// last \boxed{} (MATH's solution field), else the whole text (MATH-500's answer field).
std::string reference_answer(std::string_view reference);

struct ScoreOptions {
  std::vector<Extractor> extract = {kAllExtractors.begin(), kAllExtractors.end()};  // tried in this order
  double format_reward = 0;  // the reward of a wrong answer that was marked (found by any but last_number)
  VerifyOptions verify;

  // From an environment's options: "extract" (a list of extractor names, or one name, or
  // names joined by commas), "format_reward" in [0, 1), "rel_tol" in (0, 0.1],
  // "time_limit_s" in (0, 60]. Other keys are left to the caller. Throws rlx::Error naming
  // the key and the value.
  static ScoreOptions from_json(const nlohmann::json& options);
};

enum class Outcome {
  correct,      // reward 1
  wrong,        // reward 0 (format_reward when marked)
  unextracted,  // no answer found in the response
  unparsed,     // the checker could not read the answer or the reference (counted, never silent)
  limit,        // the checker reached a bound (size, depth, time)
};

constexpr std::array<std::pair<Outcome, std::string_view>, 5> enum_names(Outcome) {
  return {{{Outcome::correct, "correct"},
           {Outcome::wrong, "wrong"},
           {Outcome::unextracted, "unextracted"},
           {Outcome::unparsed, "unparsed"},
           {Outcome::limit, "limit"}}};
}

struct Score {
  double reward = 0;
  Outcome outcome = Outcome::unextracted;
  std::optional<Extracted> extracted;
  std::string detail;  // the checker's reason for unparsed and limit
};

// `reference` is a final answer (reference_answer() of a dataset's field). Never throws.
Score score_response(std::string_view response, std::string_view reference, const ScoreOptions& options = {});

}  // namespace rlx::env::math
