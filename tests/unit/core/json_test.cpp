#include "rlx/core/json.hpp"

#include <string>

#include "../helpers.hpp"

using rlx::JsonError;
using rlx::parse_json;

TEST_CASE("parse_json bounds nesting and rejects numbers that do not fit a double", "[core][json]") {
  // At the bound: parsed. One level deeper: an error naming the input, not a crash.
  const auto nested = [](int d) { return std::string(static_cast<size_t>(d), '[') + std::string(static_cast<size_t>(d), ']'); };
  CHECK(parse_json(nested(8), "x", 8).is_array());
  CHECK_THROWS_WITH(parse_json(nested(9), "the body", 8), Catch::Contains("the body") && Catch::Contains("deeper than 8"));
  // 50,000 deep (the depth that crashed rlx serve) is refused the same way.
  CHECK_THROWS_AS(parse_json<nlohmann::ordered_json>(nested(50000), "the body"), JsonError);
  CHECK_THROWS_WITH(parse_json(R"({"a": {"b": {"c": 1}}})", "cfg", 2), Catch::Contains("deeper than 2"));
  CHECK(parse_json(R"({"a": {"b": 1}})", "cfg", 2)["a"]["b"] == 1);
  // 1e999 overflows a double: an error naming the input; large finite numbers are kept.
  CHECK_THROWS_WITH(parse_json(R"({"temperature": 1e999})", "the body"), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(parse_json("[-1e400]", "x"), Catch::Contains("out of range"));
  CHECK(parse_json("[1e308, 1e-400]", "x")[0].get<double>() == 1e308);
  // Syntax errors name the input and the byte.
  CHECK_THROWS_WITH(parse_json(R"({"a": })", "model/config.json"),
                    Catch::Contains("model/config.json") && Catch::Contains("at byte 7"));
}
