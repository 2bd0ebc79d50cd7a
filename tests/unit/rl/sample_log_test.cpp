#include "rlx/rl/sample_log.hpp"

#include <catch2/catch.hpp>

namespace {
// A group of `n` samples of prompt "p{index}=" answered "a{index}.{k}", at version 3 (the
// last sample's last token at 4), with the environment's info on each.
rlx::bus::TrajectoryGroup group(const rlx::Tokenizer& tok, uint64_t index, uint32_t n) {
  rlx::bus::TrajectoryGroup g{.lease_id = index, .prompt_index = index, .epoch = 0, .worker = "w"};
  for (uint32_t k = 0; k < n; ++k) {
    rlx::bus::Trajectory t;
    const auto prompt = tok.encode("p" + std::to_string(index) + "=");
    const auto answer = tok.encode("a" + std::to_string(index) + "." + std::to_string(k));
    t.tokens.assign(prompt.begin(), prompt.end());
    t.tokens.insert(t.tokens.end(), answer.begin(), answer.end());
    t.prompt_len = static_cast<int32_t>(prompt.size());
    t.loss_mask.assign(t.tokens.size(), 0);
    t.logprobs.assign(t.tokens.size(), 0.0f);
    std::vector<int64_t> v(t.tokens.size(), -1);
    for (size_t i = prompt.size(); i < v.size(); ++i) t.loss_mask[i] = 1, v[i] = 3;
    if (k + 1 == n) v.back() = 4;
    t.versions = rlx::bus::TokenVersions(v);
    t.reward = static_cast<float>(k % 2);
    t.finish = "stop";
    t.metadata = nlohmann::json{{"env", {{"errors_unparsed", 0}}},
                                {"info", {{"extracted", std::to_string(index)}, {"outcome", "wrong"}}}}
                     .dump();
    g.samples.push_back(std::move(t));
  }
  return g;
}
}  // namespace

TEST_CASE("sample log: K samples as text, one per group in prompt order first, with reward, answer and version",
          "[learner]") {
  const rlx::CharTokenizer tok(rlx::default_char_alphabet());
  // Groups arrive in any order; prompts 5, 2, 9 with 2, 3 and 1 samples.
  std::vector<rlx::bus::TrajectoryGroup> groups{group(tok, 5, 2), group(tok, 2, 3), group(tok, 9, 1)};
  rlx::bus::BatchView batch;
  for (const auto& g : groups) batch.groups.push_back(rlx::bus::view_of(g));

  const auto picked = rlx::rl::readable_samples(batch, tok, 12, 4);
  REQUIRE(picked.size() == 4);
  // Round one: prompts 2, 5, 9; round two: prompt 2's second sample.
  CHECK(picked[0]["prompt_index"] == 2);
  CHECK(picked[1]["prompt_index"] == 5);
  CHECK(picked[2]["prompt_index"] == 9);
  CHECK(picked[3]["prompt_index"] == 2);
  CHECK(picked[3]["sample"] == 1);
  CHECK(picked[0]["step"] == 12);
  CHECK(picked[0]["prompt"] == "p2=");
  CHECK(picked[0]["response"] == "a2.0");
  CHECK(picked[3]["reward"] == 1.0);
  CHECK(picked[0]["extracted"] == "2");
  CHECK(picked[0]["info"]["outcome"] == "wrong");
  CHECK(picked[0]["version"] == 3);
  CHECK(!picked[0].contains("version_min"));
  CHECK(picked[2]["version"] == 4);  // prompt 9's only sample ends under version 4
  CHECK(picked[2]["version_min"] == 3);
  CHECK(rlx::rl::readable_samples(batch, tok, 12, 100).size() == 6);  // every sample, no more

  const auto md = rlx::rl::samples_markdown(12, picked);
  CHECK_THAT(md, Catch::Contains("## step 12"));
  CHECK_THAT(md, Catch::Contains("### sample 1: prompt 2, reward 0, version 3, finish stop, extracted `2`"));
  CHECK_THAT(md, Catch::Contains("\n    a2.0\n"));  // an indented code block

  // Bytes a tokenizer decodes that are not UTF-8 become U+FFFD in the JSON line.
  nlohmann::json bad = {{"response", std::string("ok\xff")}};
  CHECK(rlx::rl::json_line(bad) == "{\"response\":\"ok\xef\xbf\xbd\"}");
}
