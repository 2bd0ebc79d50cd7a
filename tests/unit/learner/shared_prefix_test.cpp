// A prompt shared by several sequences (one prompt's samples) packed once: the packing, and
// the learner's steps and annotations, which must equal those of every sequence with its
// own copy of the prompt.
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

#include "rlx/core/rng.hpp"
#include "rlx/learner/batching.hpp"
#include "rlx/learner/learner.hpp"

#include "../test_models.hpp"

namespace {

// `groups` prompts of the given lengths, `samples` sequences each: the prompt untrained,
// then 1.. `samples` trained tokens; plus two sequences of their own.
std::vector<rlx::Sequence> grouped(const std::vector<int64_t>& prompts, int samples, int64_t vocab, uint64_t seed) {
  rlx::RngStream rng(seed, 0);
  std::vector<rlx::Sequence> out;
  for (auto P : prompts) {
    std::vector<int64_t> prompt;
    for (int64_t i = 0; i < P; ++i) prompt.push_back(rng.uniform_int(0, vocab - 1));
    for (int k = 0; k < samples; ++k) {
      rlx::Sequence s;
      s.tokens = prompt;
      s.loss_mask.assign(prompt.size(), 0);
      for (int i = 0; i <= k; ++i) {
        s.tokens.push_back(rng.uniform_int(0, vocab - 1));
        s.loss_mask.push_back(1);
      }
      s.values["adv"].assign(s.tokens.size(), static_cast<float>(k) - 1.5f);
      out.push_back(std::move(s));
    }
  }
  for (int64_t L : {6, 3}) {
    rlx::Sequence s;
    for (int64_t i = 0; i < L; ++i) {
      s.tokens.push_back(rng.uniform_int(0, vocab - 1));
      s.loss_mask.push_back(i >= 1);
    }
    s.values["adv"].assign(s.tokens.size(), 0.5f);
    out.push_back(std::move(s));
  }
  return out;
}

int64_t total_tokens(const std::vector<rlx::Sequence>& seqs) {
  int64_t n = 0;
  for (const auto& s : seqs) n += static_cast<int64_t>(s.tokens.size());
  return n;
}

}  // namespace

TEST_CASE("shared prefixes: a prompt's samples packed after one copy of it, every token where it belongs", "[learner]") {
  const auto seqs = grouped({10, 7, 12}, 4, 50, 1);
  int64_t trained = 0;
  for (const auto& s : seqs)
    for (size_t i = 1; i < s.tokens.size(); ++i) trained += s.loss_mask[i];
  for (int64_t row : {64, 20}) {
    INFO("row_tokens " << row);
    auto mbs = rlx::pack_micro_batches(seqs, {.micro_batch_tokens = 128, .row_tokens = row});
    int64_t tokens = 0, loss_tokens = 0, shared_tokens = 0, shared_blocks = 0;
    std::set<int64_t> members;
    for (const auto& mb : mbs) {
      REQUIRE(mb.prefix.defined());
      tokens += (mb.segments > 0).sum().item<int64_t>();
      loss_tokens += mb.loss_tokens;
      shared_tokens += mb.shared_tokens;
      auto tok = mb.tokens.accessor<int64_t, 2>(), tgt = mb.targets.accessor<int64_t, 2>(),
           sq = mb.sequence.accessor<int64_t, 2>(), pos = mb.positions.accessor<int64_t, 2>(),
           seg = mb.segments.accessor<int64_t, 2>(), pre = mb.prefix.accessor<int64_t, 2>();
      auto msk = mb.loss_mask.accessor<float, 2>();
      auto adv = mb.values.at("adv").accessor<float, 2>();
      for (int64_t r = 0; r < mb.tokens.size(0); ++r)
        for (int64_t t = 0; t < mb.tokens.size(1); ++t) {
          if (sq[r][t] < 0) continue;
          // Every token of a sequence at its own position; trained targets its next token.
          const auto& s = seqs[static_cast<size_t>(sq[r][t])];
          CHECK(tok[r][t] == s.tokens[static_cast<size_t>(pos[r][t])]);
          if (msk[r][t] != 0) {
            CHECK(tgt[r][t] == s.tokens[static_cast<size_t>(pos[r][t] + 1)]);
            CHECK(adv[r][t] == s.values.at("adv")[static_cast<size_t>(pos[r][t] + 1)]);
          }
        }
      for (const auto& p : mb.shared) {
        ++shared_blocks;
        REQUIRE(p.members.size() >= 2);
        const auto& first = seqs[static_cast<size_t>(p.members.front())];
        CHECK(p.length == static_cast<int64_t>(std::count(first.loss_mask.begin(), first.loss_mask.end(), 0)) - 1);
        for (int64_t t = p.start; t < p.start + p.length; ++t) {
          CHECK(tok[p.row][t] == first.tokens[static_cast<size_t>(t - p.start)]);
          CHECK(pos[p.row][t] == t - p.start);
          CHECK(msk[p.row][t] == 0);
          CHECK(sq[p.row][t] == -1);
        }
        // Its members' tokens name its segment as their prefix.
        const int64_t own = seg[p.row][p.start];
        for (int64_t t = 0; t < mb.tokens.size(1); ++t)
          if (sq[p.row][t] >= 0 && std::count(p.members.begin(), p.members.end(), sq[p.row][t]))
            CHECK(pre[p.row][t] == own);
        for (auto m : p.members) CHECK(members.insert(m).second);
      }
    }
    CHECK(loss_tokens == trained);
    CHECK(tokens + shared_tokens == total_tokens(seqs));
    if (row == 64) {
      CHECK(shared_blocks == 3);  // a block per prompt
      CHECK(shared_tokens == 3 * (9 + 6 + 11));
    } else {
      // 20-token rows: a 12-token prompt's four samples (12..15 tokens) do not fit after one
      // copy, so they are split into blocks that do, each with its copy; one left alone is a
      // sequence of its own.
      CHECK(shared_blocks > 3);
      CHECK(shared_tokens < 3 * (9 + 6 + 11));
    }
  }
  // Off, or without packing: every sequence whole.
  for (auto o : {rlx::PackOptions{.micro_batch_tokens = 128, .row_tokens = 64, .share_prefix = false},
                 rlx::PackOptions{.micro_batch_tokens = 128, .row_tokens = 64, .pack = false}}) {
    int64_t tokens = 0;
    for (const auto& mb : rlx::pack_micro_batches(seqs, o)) {
      CHECK_FALSE(mb.prefix.defined());
      CHECK(mb.shared.empty());
      tokens += (mb.segments > 0).sum().item<int64_t>();
    }
    CHECK(tokens == total_tokens(seqs));
  }
}

TEST_CASE("shared prefixes: the learner's steps and annotations equal those with a copy per sequence", "[learner]") {
  const auto cfg = rlx::test::test_model({.vocab = 37, .hidden = 16, .heads = 4, .kv_heads = 2, .head_dim = 4,
                                          .intermediate = 24, .qwen2 = true});
  const auto seqs = grouped({9, 5}, 3, cfg.vocab_size, 2);
  auto comm = rlx::dist::single_process();
  std::vector<std::unique_ptr<rlx::Learner>> learners;
  std::vector<rlx::StepResult> results;
  for (bool share : {false, true}) {
    rlx::LearnerOptions lo;
    lo.packing = {.micro_batch_tokens = 64, .row_tokens = 32, .share_prefix = share};
    lo.entropy = true;
    lo.value_head = true;
    lo.optimizer.lr = 1e-2;
    auto& l = *learners.emplace_back(std::make_unique<rlx::Learner>(cfg, *comm, lo));
    l.init_weights(7);
    auto loss = [](const rlx::MicroBatch& mb, const rlx::TokenOutputs& out, const rlx::StepContext& ctx,
                   rlx::MetricSums&) {
      const auto& adv = mb.values.at("adv");
      return -((out.logprobs * adv + 0.1 * out.entropy - 0.5 * (out.values - adv).pow(2)) * mb.loss_mask).sum() /
             ctx.global_loss_tokens;
    };
    for (int i = 0; i < 3; ++i) results.push_back(l.step(seqs, loss));
  }
  for (int i = 0; i < 3; ++i) {
    INFO("step " << i);
    CHECK(results[3 + i].loss == Approx(results[i].loss).epsilon(1e-5));
    CHECK(results[3 + i].grad_norm == Approx(results[i].grad_norm).epsilon(1e-5));
    CHECK(results[3 + i].tokens < results[i].tokens);  // the prompts ran once
  }
  const auto a = learners[0]->trained_tensors(), b = learners[1]->trained_tensors();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    // Float rounding only (the sums run in another order); each step moves weights by ~1e-2.
    INFO("tensor " << i << ", max difference " << (a[i] - b[i]).abs().max().item<double>());
    CHECK(at::allclose(a[i], b[i], 1e-5, 2e-5));
  }
  // Annotations to every sequence, prompt positions included: the head over every position,
  // packed with a copy per sequence and with sharing.
  auto every = [&](std::vector<rlx::Sequence> out, bool share) {
    rlx::annotate_sequences(out, {.micro_batch_tokens = 64, .row_tokens = 32, .share_prefix = share},
                            learners[0]->comm(), [&](const rlx::MicroBatch& mb) {
                              CHECK(mb.prefix.defined() == share);
                              return std::map<std::string, at::Tensor>{{"logp", learners[0]->logprobs(mb)}};
                            });
    return out;
  };
  const auto copy = every(seqs, false), shared = every(seqs, true);
  // What the learner annotates (old log-probs): the head at the trained positions only
  // (LearnerOptions::head_on_loss_tokens), 0 at the others.
  auto trained = seqs;
  learners[0]->annotate(trained, "logp");
  for (size_t i = 0; i < seqs.size(); ++i) {
    INFO("sequence " << i);
    const auto& x = copy[i].values.at("logp");
    const auto& y = shared[i].values.at("logp");
    const auto& t = trained[i].values.at("logp");
    REQUIRE(x.size() == y.size());
    REQUIRE(t.size() == x.size());
    CHECK(x[0] == 0.0f);
    for (size_t k = 1; k < x.size(); ++k) {
      CHECK(y[k] == Approx(x[k]).margin(1e-5));
      if (seqs[i].loss_mask[k]) CHECK(t[k] == Approx(x[k]).margin(1e-5));
      else CHECK(t[k] == 0.0f);
    }
  }
}
