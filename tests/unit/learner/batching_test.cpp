#include "rlx/learner/batching.hpp"

#include <catch2/catch.hpp>
#include <set>

#include "rlx/core/rng.hpp"

namespace {
rlx::Sequence seq(int64_t len, int64_t first) {
  rlx::Sequence s;
  for (int64_t i = 0; i < len; ++i) {
    s.tokens.push_back(first + i);
    s.loss_mask.push_back(i >= 1);
  }
  s.values["adv"] = std::vector<float>(static_cast<size_t>(len), static_cast<float>(first));
  return s;
}
}  // namespace

TEST_CASE("packing keeps every token once, within budgets, with targets inside each sequence", "[learner]") {
  rlx::RngStream rng(5, 0);
  std::vector<rlx::Sequence> seqs;
  int64_t total = 0, trained = 0;
  for (int i = 0; i < 40; ++i) {
    const int64_t len = rng.uniform_int(1, 30);
    seqs.push_back(seq(len, 1000 * i));
    total += len;
    trained += len - 1;
  }
  for (bool pack : {true, false}) {
    auto mbs = rlx::pack_micro_batches(seqs, {.micro_batch_tokens = 96, .row_tokens = 32, .pack = pack});
    int64_t tokens = 0, loss_tokens = 0;
    std::multiset<int64_t> seen;
    for (const auto& mb : mbs) {
      CHECK(mb.tokens.numel() <= 96);
      CHECK(mb.tokens.size(1) <= 32);
      tokens += (mb.segments > 0).sum().item<int64_t>();
      loss_tokens += mb.loss_tokens;
      CHECK(mb.loss_mask.sum().item<double>() == mb.loss_tokens);
      for (auto s : mb.sequences) seen.insert(s);
      auto tok = mb.tokens.accessor<int64_t, 2>(), tgt = mb.targets.accessor<int64_t, 2>(),
           sq = mb.sequence.accessor<int64_t, 2>();
      auto msk = mb.loss_mask.accessor<float, 2>();
      auto adv = mb.values.at("adv").accessor<float, 2>();
      for (int64_t r = 0; r < mb.tokens.size(0); ++r)
        for (int64_t t = 0; t < mb.tokens.size(1); ++t) {
          if (msk[r][t] == 0) continue;
          // A trained target is the next token of the same sequence.
          CHECK(sq[r][t] >= 0);
          CHECK(tgt[r][t] == tok[r][t] + 1);
          CHECK(adv[r][t] == static_cast<float>(1000 * sq[r][t]));
        }
    }
    CHECK(tokens == total);
    CHECK(loss_tokens == trained);
    CHECK(seen.size() == seqs.size());
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == seqs.size());
    if (pack) {
      int64_t rows = 0;
      for (const auto& mb : mbs) rows += mb.tokens.size(0);
      CHECK(rows < 40);  // several sequences share rows
    }
  }
}

TEST_CASE("packing rejects what it cannot hold, naming the sequence", "[learner]") {
  CHECK_THROWS_WITH(rlx::pack_micro_batches({seq(40, 0)}, {.micro_batch_tokens = 64, .row_tokens = 32}),
                    Catch::Contains("sequence 0 has 40 tokens"));
  auto bad = seq(4, 0);
  bad.loss_mask.pop_back();
  CHECK_THROWS_WITH(rlx::pack_micro_batches({seq(3, 0), bad}, {}), Catch::Contains("sequence 1"));
  CHECK_THROWS_WITH(rlx::pack_micro_batches({}, {.micro_batch_tokens = 8, .row_tokens = 16}),
                    Catch::Contains("micro_batch_tokens"));
}

TEST_CASE("packed rows are no longer than the longest sequence (attention is dense over a row)", "[learner]") {
  std::vector<rlx::Sequence> seqs;
  for (int i = 0; i < 10; ++i) seqs.push_back(seq(i % 2 ? 8 : 3, 100 * i));  // 8 and 3 tokens
  auto mbs = rlx::pack_micro_batches(seqs, {.micro_batch_tokens = 4096, .row_tokens = 2048});
  int64_t rows = 0;
  for (const auto& mb : mbs) {
    CHECK(mb.tokens.size(1) == 8);  // not a 2048-token row holding all ten
    rows += mb.tokens.size(0);
  }
  CHECK(rows == 8);  // five full 8-token rows; the five 3-token ones as 3 + 3, 3 + 3, 3
}

TEST_CASE("assign_ranks: a batch's groups shared by tokens, every rank fed, the same answer on every rank", "[learner]") {
  // Largest first to the least loaded rank: 9 -> 0, 7 -> 1, 5 -> 1 (7 < 9), 4 -> 0 (12 > 9),
  // then 1 -> rank 1 (12 < 13).
  CHECK((rlx::assign_ranks({5, 9, 1, 7, 4}, 2) == std::vector<uint32_t>{1, 0, 1, 1, 0}));
  // Equal groups alternate; as many groups as ranks: one each.
  CHECK((rlx::assign_ranks({3, 3, 3, 3}, 2) == std::vector<uint32_t>{0, 1, 0, 1}));
  CHECK((rlx::assign_ranks({1, 100, 2}, 3) == std::vector<uint32_t>{2, 0, 1}));
  CHECK((rlx::assign_ranks({4, 2}, 1) == std::vector<uint32_t>{0, 0}));
  CHECK_THROWS_WITH(rlx::assign_ranks({1}, 0), Catch::Contains("num_ranks"));
}
