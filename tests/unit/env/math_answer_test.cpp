// The final answer in a response (each extractor, their order, switching them off), the
// final answer in a dataset's reference (GSM8K, MATH), and a response's score (reward,
// format reward, outcome counters) with its options read from an environment's options.
#include "rlx/env/math_answer.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "rlx/core/error.hpp"

using nlohmann::json;
using namespace rlx::env::math;

namespace {

struct ExtractCase {
  const char* response;
  const char* expected;  // nullptr: nothing found
  Extractor by;
};

// clang-format off
const ExtractCase kExtractCases[] = {
    {R"(so $x = \boxed{\frac{3}{4}}$.)", R"(\frac{3}{4})", Extractor::boxed},
    {R"(\boxed{\frac{\sqrt{2}}{2}})", R"(\frac{\sqrt{2}}{2})", Extractor::boxed},
    {R"(first \boxed{1}, then finally \boxed{2}.)", "2", Extractor::boxed},
    {R"(\fbox{5})", "5", Extractor::boxed},
    {R"(\boxed 7 is it)", "7", Extractor::boxed},
    {R"(\boxed{3} and then \boxed{4)", "3", Extractor::boxed},             // the last one is cut off
    {R"(\boxed{\{1, 2\}})", R"(\{1, 2\})", Extractor::boxed},
    {R"(\boxed{\text{(B)}} and \fbox{C})", "C", Extractor::boxed},
    {"48 / 2 = 24\n#### 1,234", "1,234", Extractor::hash},
    {"#### 72\nthat is all", "72", Extractor::hash},
    {"The answer is 42.", "42", Extractor::answer_is},
    {R"(So the final answer is: $\frac{1}{2}$.)", R"(\frac{1}{2})", Extractor::answer_is},
    {"**Answer:** 3.5", "3.5", Extractor::answer_is},
    {"The answer is 5. Then I checked it twice.", "5", Extractor::answer_is},
    {"ANSWER IS 18 dollars", "18 dollars", Extractor::answer_is},
    {"I get 3 apples, then 5 pears", "5", Extractor::last_number},
    {"the total is -7", "-7", Extractor::last_number},
    {"5-3", "3", Extractor::last_number},
    {"it costs 1,234.5 dollars", "1,234.5", Extractor::last_number},
    {"the ratio is 3/4", "3/4", Extractor::last_number},
    {"only .5 left", ".5", Extractor::last_number},
    {"x = (2)-1 = 1, 2", "2", Extractor::last_number},
    {"no numbers here", nullptr, Extractor::boxed},
    {R"(\boxed{} nothing inside)", nullptr, Extractor::boxed},
    {"", nullptr, Extractor::boxed},
};
// clang-format on

}  // namespace

TEST_CASE("math_answer: extraction by each extractor, in the default order", "[env][math]") {
  for (const auto& c : kExtractCases) {
    INFO(c.response);
    const auto got = extract_answer(c.response);
    if (!c.expected) {
      CHECK(!got);
      continue;
    }
    REQUIRE(got);
    CHECK(got->text == c.expected);
    CHECK(got->by == c.by);
  }
}

TEST_CASE("math_answer: the order of extractors decides, and each can be switched off", "[env][math]") {
  const std::string both = "The answer is 3.\n#### 4\nso \\boxed{5}";
  CHECK(extract_answer(both)->text == "5");
  const std::vector<Extractor> hash_first = {Extractor::hash, Extractor::boxed};
  CHECK(extract_answer(both, hash_first)->text == "4");
  const std::vector<Extractor> answer_is_first = {Extractor::answer_is};
  CHECK(extract_answer(both, answer_is_first)->text == "3");
  const std::vector<Extractor> boxed_only = {Extractor::boxed};
  CHECK(!extract_answer("the answer is 4", boxed_only));
  CHECK(!extract_answer("I think 4", std::vector<Extractor>{Extractor::boxed, Extractor::hash, Extractor::answer_is}));
  CHECK(extract_answer("I think 4")->by == Extractor::last_number);
}

TEST_CASE("math_answer: a dataset's reference as a final answer", "[env][math]") {
  CHECK(reference_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72") == "72");
  CHECK(reference_answer("#### 1,000") == "1,000");
  CHECK(reference_answer(R"(The common denominator is 6, so $\boxed{\frac{5}{6}}$.)") == R"(\frac{5}{6})");
  CHECK(reference_answer(R"(\frac{1}{2})") == R"(\frac{1}{2})");
  CHECK(reference_answer("  7 \n") == "7");
}

TEST_CASE("math_answer: score, format reward and outcomes", "[env][math]") {
  SECTION("correct") {
    const auto s = score_response(R"(We get $\boxed{0.75}$.)", R"(\frac34)");
    CHECK(s.reward == 1);
    CHECK(s.outcome == Outcome::correct);
    REQUIRE(s.extracted);
    CHECK(s.extracted->by == Extractor::boxed);
  }
  SECTION("wrong: format_reward only for a marked answer") {
    ScoreOptions o;
    o.format_reward = 0.1;
    const auto marked = score_response(R"(\boxed{3})", "4", o);
    CHECK(marked.outcome == Outcome::wrong);
    CHECK(marked.reward == Approx(0.1));
    const auto unmarked = score_response("maybe 3", "4", o);
    CHECK(unmarked.outcome == Outcome::wrong);
    CHECK(unmarked.reward == 0);
    CHECK(score_response(R"(\boxed{4})", "4", o).reward == 1);
  }
  SECTION("nothing extracted") {
    const auto s = score_response("I do not know.", "4");
    CHECK(s.outcome == Outcome::unextracted);
    CHECK(s.reward == 0);
    CHECK(!s.extracted);
  }
  SECTION("an answer the checker cannot read is counted as unparsed, with the reason") {
    const auto s = score_response(R"(\boxed{\frac{1}{}})", "0.5");
    CHECK(s.outcome == Outcome::unparsed);
    CHECK(s.reward == 0);
    CHECK_THAT(s.detail, Catch::Contains("cannot read"));
  }
  SECTION("a check past its bound is counted as limit") {
    ScoreOptions o;
    o.verify.max_chars = 10;
    const auto s = score_response(R"(\boxed{1+2+3+4+5+6+7})", "28", o);
    CHECK(s.outcome == Outcome::limit);
    CHECK(s.reward == 0);
  }
}

TEST_CASE("math_answer: options from an environment's options, bad values named", "[env][math]") {
  CHECK(ScoreOptions::from_json(json()).extract.size() == 4);
  CHECK(ScoreOptions::from_json(json::object()).format_reward == 0);
  const auto o = ScoreOptions::from_json({{"extract", json::array({"hash", "boxed"})}, {"format_reward", 0.1}, {"rel_tol", 1e-4},
                                          {"time_limit_s", 2}, {"prompt_key", "q"}});
  CHECK((o.extract == std::vector<Extractor>{Extractor::hash, Extractor::boxed}));
  CHECK(o.format_reward == Approx(0.1));
  CHECK(o.verify.rel_tol == Approx(1e-4));
  CHECK(o.verify.time_limit_s == 2);
  CHECK((ScoreOptions::from_json({{"extract", "boxed, last_number"}}).extract ==
         std::vector<Extractor>{Extractor::boxed, Extractor::last_number}));
  CHECK_THROWS_WITH(ScoreOptions::from_json({{"extract", json::array({"boxes"})}}),
                    Catch::Contains("unknown extractor 'boxes'") && Catch::Contains("answer_is"));
  CHECK_THROWS_WITH(ScoreOptions::from_json({{"extract", json::array()}}), Catch::Contains("no extractor"));
  CHECK_THROWS_WITH(ScoreOptions::from_json({{"format_reward", 1.5}}), Catch::Contains("format_reward"));
  CHECK_THROWS_WITH(ScoreOptions::from_json({{"rel_tol", "small"}}), Catch::Contains("rel_tol"));
  CHECK_THROWS_WITH(ScoreOptions::from_json({{"time_limit_s", 0}}), Catch::Contains("time_limit_s"));
}
