#include "rlx/learner/checkpoint.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "../helpers.hpp"
#include "../test_models.hpp"
#include "rlx/core/files.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/safetensors.hpp"

namespace fs = std::filesystem;

namespace {
rlx::ModelConfig small() { return rlx::test::test_model({}); }

rlx::StepResult train_step(rlx::Learner& l) {
  rlx::Sequence s;
  s.tokens = {1, 5, 7, 3, 9, 2};
  s.loss_mask = {0, 1, 1, 1, 1, 1};
  return l.step({s}, [](const rlx::MicroBatch& mb, const rlx::TokenOutputs& out, const rlx::StepContext& ctx,
                        rlx::MetricSums&) { return -(out.logprobs * mb.loss_mask).sum() / ctx.global_loss_tokens; });
}

void flip_byte(const fs::path& p, uint64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}
}  // namespace

TEST_CASE("checkpoints: saved, verified, the last K kept, and damage detected with the previous one used",
          "[learner][checkpoint]") {
  rlx::test::TempDir dir;
  auto comm = rlx::dist::single_process();
  rlx::Learner a(small(), *comm, {});
  a.init_weights(1);
  const rlx::CheckpointOptions co{.root = dir / "ckpt", .keep_last = 2};
  for (int i = 0; i < 3; ++i) {
    train_step(a);
    rlx::save_checkpoint(a, co, {{"hub_state", "hub.state"}});
  }
  auto all = rlx::list_checkpoints(co.root);
  REQUIRE(all.size() == 2);  // step 1 pruned
  CHECK(all[0].filename() == "step_00000003");
  auto info = rlx::verify_checkpoint(all[0]);
  REQUIRE(info.ok);
  CHECK(info.step == 3);
  CHECK(info.world_size == 1);
  CHECK(info.learner["references"]["hub_state"] == "hub.state");

  // A fresh learner loads step 3 exactly.
  rlx::Learner b(small(), *comm, {});
  auto loaded = rlx::load_latest_checkpoint(b, co);
  REQUIRE(loaded);
  CHECK(loaded->step == 3);
  CHECK(b.step_count() == 3);
  for (size_t u = 0; u < a.model().units().size(); ++u) {
    CHECK(at::equal(a.model().units()[u].shard, b.model().units()[u].shard));
    CHECK(at::equal(a.optimizer().slots()[u].exp_avg_sq, b.optimizer().slots()[u].exp_avg_sq));
  }
  CHECK(a.rng().state() == b.rng().state());

  const auto newest = all[0], shard = newest / "rank-00000-of-00001.safetensors";
  const auto backup = dir / "backup";
  fs::copy(newest, backup);
  auto restore = [&] {
    rlx::remove_tree(newest);
    fs::copy(backup, newest);
    REQUIRE(rlx::verify_checkpoint(newest).ok);
  };
  SECTION("a flipped byte") {
    flip_byte(shard, fs::file_size(shard) - 5);
    CHECK_THAT(rlx::verify_checkpoint(newest).problem, Catch::Contains("corrupted") && Catch::Contains("rank-00000"));
  }
  SECTION("a truncated shard") {
    fs::resize_file(shard, fs::file_size(shard) / 2);
    CHECK_THAT(rlx::verify_checkpoint(newest).problem, Catch::Contains("truncated"));
  }
  SECTION("a missing manifest") {
    fs::remove(newest / "MANIFEST.json");
    CHECK_THAT(rlx::verify_checkpoint(newest).problem, Catch::Contains("incomplete"));
  }
  SECTION("a manifest that is not JSON") {
    rlx::test::write_file(newest / "MANIFEST.json", "{\"files\": [");
    CHECK_THAT(rlx::verify_checkpoint(newest).problem, Catch::Contains("MANIFEST.json"));
  }
  // Whatever the damage, loading falls back to step 2 and says why.
  rlx::Learner c(small(), *comm, {});
  auto fallback = rlx::load_latest_checkpoint(c, co);
  REQUIRE(fallback);
  CHECK(fallback->step == 2);
  REQUIRE(fallback->skipped.size() == 1);
  CHECK_THAT(fallback->skipped[0], Catch::Contains("step_00000003"));
  restore();
}

TEST_CASE("export_hf writes a directory load_hf reads back exactly", "[learner][checkpoint]") {
  rlx::test::TempDir dir;
  auto comm = rlx::dist::single_process();
  rlx::Learner l(small(), *comm, {});
  l.init_weights(4);
  train_step(l);
  rlx::export_hf(l, dir / "hf");
  auto model = rlx::load_hf(dir / "hf");
  auto params = l.model().gather_parameters();
  std::map<std::string, at::Tensor> loaded;
  for (auto& [n, p] : model->hf_parameters()) loaded[n] = p;
  REQUIRE(loaded.size() == params.size());
  for (auto& [n, p] : params) CHECK(at::equal(loaded.at(n), p));
}

TEST_CASE("a learner with a value head: the head trains, is checkpointed, and must match on load", "[learner][checkpoint]") {
  rlx::test::TempDir dir;
  auto comm = rlx::dist::single_process();
  rlx::LearnerOptions o;
  o.optimizer.lr = 1e-2;
  o.policy_head = false;
  o.value_head = true;
  rlx::Learner a(small(), *comm, o);
  a.init_weights(1);
  REQUIRE(a.value_head().defined());
  CHECK(a.value_head().abs().sum().item<double>() == 0);  // zero-initialised
  rlx::Sequence s;
  s.tokens = {1, 5, 7, 3, 9, 2};
  s.loss_mask = {0, 1, 1, 1, 1, 1};
  // Regress every trained position's value onto 2.
  rlx::LossFn mse = [](const rlx::MicroBatch& mb, const rlx::TokenOutputs& out, const rlx::StepContext& ctx,
                       rlx::MetricSums&) {
    REQUIRE(!out.logprobs.defined());
    return ((out.values - 2.0).pow(2) * mb.loss_mask).sum() / ctx.global_loss_tokens;
  };
  const double first = a.step({s}, mse).loss;
  double last = first;
  for (int i = 0; i < 30; ++i) last = a.step({s}, mse).loss;
  INFO("value loss " << first << " -> " << last);
  CHECK(last < 0.1 * first);
  std::vector<rlx::Sequence> seqs{s};
  a.annotate(seqs, "", "old_values");
  CHECK(seqs[0].values.at("old_values")[0] == 0.0f);                      // the first token has no position before it
  CHECK(seqs[0].values.at("old_values")[3] == Approx(2.0).margin(0.5));  // learned

  const rlx::CheckpointOptions co{.root = dir / "ckpt"};
  rlx::save_checkpoint(a, co);
  rlx::Learner b(small(), *comm, o);
  REQUIRE(rlx::load_latest_checkpoint(b, co));
  CHECK(at::equal(a.value_head(), b.value_head()));
  CHECK(at::equal(a.optimizer().slots().back().exp_avg, b.optimizer().slots().back().exp_avg));
  // A learner without a value head refuses the checkpoint, saying why.
  rlx::Learner c(small(), *comm, {});
  CHECK_THROWS_WITH(rlx::load_latest_checkpoint(c, co), Catch::Contains("value head"));
}

TEST_CASE("a checkpoint from before units laid biases last loads into today's layout exactly",
          "[learner][checkpoint]") {
  // Qwen2's q/k/v biases: a unit's flat order was the module's (q weight, q bias, k weight, ...);
  // today the biases come after the matrices (fsdp.hpp). A checkpoint without "slots" is read
  // in the module's order and each parameter lands where today's unit keeps it.
  rlx::test::TempDir dir;
  auto comm = rlx::dist::single_process();
  const auto cfg = rlx::test::test_model({.qwen2 = true});
  rlx::Learner a(cfg, *comm, {});
  a.init_weights(3);
  train_step(a);
  const rlx::CheckpointOptions co{.root = dir / "ckpt"};
  const auto saved = rlx::save_checkpoint(a, co, {});
  auto lj = nlohmann::json::parse(rlx::test::read_file(saved / "learner.json"));
  // Today's checkpoints name their order: a block's q and k weights next to each other.
  REQUIRE(lj["units"][1].contains("slots"));
  CHECK(lj["units"][1]["slots"][0] == "model.layers.0.self_attn.q_proj.weight");
  CHECK(lj["units"][1]["slots"][1] == "model.layers.0.self_attn.k_proj.weight");
  // Rewrite it as the old layout: each unit's three flat tensors in the module's order, no "slots".
  std::map<std::string, size_t> place;
  for (auto& [name, p] : a.model().module().hf_parameters()) place.emplace(name, place.size());
  const auto shard = saved / "rank-00000-of-00001.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
  bool reordered = false;
  {
    auto f = rlx::SafetensorsFile::open(shard);
    metadata = f.header().metadata;
    for (const auto& u : a.model().units()) {
      auto slots = u.slots;
      std::stable_sort(slots.begin(), slots.end(),
                       [&](const auto& x, const auto& y) { return place.at(x.name) < place.at(y.name); });
      reordered = reordered || !std::equal(slots.begin(), slots.end(), u.slots.begin(),
                                           [](const auto& x, const auto& y) { return x.name == y.name; });
      for (const char* part : {".param", ".exp_avg", ".exp_avg_sq"}) {
        const auto now = f.tensor(u.name + part);
        auto old = at::zeros_like(now);
        int64_t at = 0;
        for (const auto& s : slots) {
          old.narrow(0, at, s.numel).copy_(now.narrow(0, s.offset, s.numel));
          at += s.numel;
        }
        tensors.emplace_back(u.name + part, old);
      }
    }
  }
  REQUIRE(reordered);  // the biases did move
  rlx::save_safetensors(shard, tensors, metadata);
  for (auto& u : lj["units"]) u.erase("slots");
  rlx::test::write_file(saved / "learner.json", lj.dump(2));
  auto manifest = nlohmann::json::parse(rlx::test::read_file(saved / "MANIFEST.json"));
  for (auto& f : manifest["files"]) {
    const auto p = saved / f["name"].get<std::string>();
    f["bytes"] = fs::file_size(p);
    f["xxh64"] = fmt::format("{:016x}", rlx::file_xxh64(p));
  }
  rlx::test::write_file(saved / "MANIFEST.json", manifest.dump(2));
  REQUIRE(rlx::verify_checkpoint(saved).ok);

  rlx::Learner b(cfg, *comm, {});
  REQUIRE(rlx::load_latest_checkpoint(b, co));
  for (size_t u = 0; u < a.model().units().size(); ++u) {
    INFO("unit " << a.model().units()[u].name);
    CHECK(at::equal(a.model().units()[u].shard, b.model().units()[u].shard));
    CHECK(at::equal(a.optimizer().slots()[u].exp_avg, b.optimizer().slots()[u].exp_avg));
    CHECK(at::equal(a.optimizer().slots()[u].exp_avg_sq, b.optimizer().slots()[u].exp_avg_sq));
  }
}
