#include "rlx/learner/optimizer.hpp"

#include <torch/optim/adamw.h>

#include <catch2/catch.hpp>

#include "../helpers.hpp"

TEST_CASE("AdamW takes LibTorch's AdamW steps, with weight decay only where the mask says", "[learner]") {
  at::manual_seed(3);
  auto a = at::randn({5, 7}).requires_grad_(true);
  auto b = at::randn({7}).requires_grad_(true);
  auto a_ref = a.detach().clone().requires_grad_(true);
  auto b_ref = b.detach().clone().requires_grad_(true);
  rlx::AdamW ours({.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1});
  ours.add(a, at::ones_like(a));
  ours.add(b, at::zeros_like(b));
  // LibTorch's AdamW, with decay on the matrix only.
  torch::optim::AdamW ref_decay({a_ref}, torch::optim::AdamWOptions(1e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1));
  torch::optim::AdamW ref_plain({b_ref}, torch::optim::AdamWOptions(1e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0));
  for (int step = 0; step < 5; ++step) {
    auto ga = at::randn({5, 7}), gb = at::randn({7});
    a.mutable_grad() = ga.clone();
    b.mutable_grad() = gb.clone();
    a_ref.mutable_grad() = ga.clone();
    b_ref.mutable_grad() = gb.clone();
    ours.step(1e-2);
    ref_decay.step();
    ref_plain.step();
  }
  CHECK(ours.step_count() == 5);
  CHECK(at::allclose(a, a_ref, 1e-6, 1e-7));
  CHECK(at::allclose(b, b_ref, 1e-6, 1e-7));
  CHECK_FALSE(at::allclose(a, a_ref.detach() / (1 - 1e-3), 1e-6, 1e-7));  // decay did something
}

TEST_CASE("AdamW rejects bad options, naming the field", "[learner]") {
  CHECK_THROWS_WITH(rlx::AdamW({.lr = -1}), Catch::Contains("optimizer.lr"));
  CHECK_THROWS_WITH(rlx::AdamW({.beta2 = 1.0}), Catch::Contains("optimizer.beta2"));
  rlx::AdamW ok({});
  CHECK_THROWS_WITH(ok.add(at::zeros({3}, at::kBFloat16), at::zeros({3})), Catch::Contains("fp32"));
}

TEST_CASE("learning-rate schedules: constant, linear warmup, cosine", "[learner]") {
  rlx::LrSchedule constant;
  CHECK(constant.at(0, 2.0) == 2.0);
  CHECK(constant.at(100, 2.0) == 2.0);
  rlx::LrSchedule warm{.kind = rlx::LrScheduleKind::linear_warmup, .warmup_steps = 3};
  CHECK(warm.at(0, 1.0) == Approx(0.25));
  CHECK(warm.at(2, 1.0) == Approx(0.75));
  CHECK(warm.at(3, 1.0) == 1.0);
  CHECK(warm.at(50, 1.0) == 1.0);
  rlx::LrSchedule cosine{.kind = rlx::LrScheduleKind::cosine, .warmup_steps = 2, .total_steps = 12, .min_lr_ratio = 0.1};
  CHECK(cosine.at(2, 1.0) == Approx(1.0));
  CHECK(cosine.at(7, 1.0) == Approx(0.1 + 0.9 * 0.5));  // half way
  CHECK(cosine.at(12, 1.0) == Approx(0.1));
  CHECK(cosine.at(40, 1.0) == Approx(0.1));
  for (int s = 3; s < 12; ++s) CHECK(cosine.at(s, 1.0) < cosine.at(s - 1, 1.0));
  rlx::LrSchedule bad{.kind = rlx::LrScheduleKind::cosine, .warmup_steps = 5, .total_steps = 5};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("schedule.total_steps"));
  CHECK_THROWS_WITH(rlx::lr_schedule_kind_from_string("linear"), Catch::Contains("constant, linear_warmup, cosine"));
}

TEST_CASE("clipping scales every gradient by max_norm / total norm", "[learner]") {
  auto p = at::zeros({2}).requires_grad_(true), q = at::zeros({1}).requires_grad_(true);
  p.mutable_grad() = at::tensor({3.0f, 0.0f});
  q.mutable_grad() = at::tensor({4.0f});
  const double norm = std::sqrt(rlx::grad_sq_norm({p, q}));
  CHECK(norm == Approx(5.0));
  // Gradients outside the CPU fp32 pass (here strided and bf16) go through the multi-tensor norm.
  auto r = at::zeros({2}).requires_grad_(true), s = at::zeros({2}).requires_grad_(true);
  r.mutable_grad() = at::tensor({3.0f, 9.0f, 4.0f, 9.0f}).view({2, 2}).select(1, 0);
  s.mutable_grad() = at::tensor({12.0f, 0.0f}).to(at::kBFloat16);
  CHECK(std::sqrt(rlx::grad_sq_norm({p, q, r, s})) == Approx(std::sqrt(25.0 + 25.0 + 144.0)));
  CHECK(rlx::clip_factor(norm, 1.0) == Approx(0.2).epsilon(1e-5));
  CHECK(rlx::clip_factor(1.0, 10.0) == 1.0);  // below the limit: untouched
  CHECK(rlx::clip_factor(1e9, 0.0) == 1.0);   // 0: no clipping
}

TEST_CASE("AdamW's gradient scale is a step on the scaled gradients, the norm ignores thread counts", "[learner]") {
  at::manual_seed(8);
  auto a = at::randn({70000}).requires_grad_(true), b = a.detach().clone().requires_grad_(true);
  auto g = at::randn({70000});
  a.mutable_grad() = g.clone();
  b.mutable_grad() = g * 0.25;
  rlx::AdamW oa({.lr = 1e-2, .weight_decay = 0.1}), ob({.lr = 1e-2, .weight_decay = 0.1});
  oa.add(a, at::ones_like(a));
  ob.add(b, at::ones_like(b));
  oa.step(1e-2, 0.25);
  ob.step(1e-2);
  CHECK(at::allclose(a, b, 1e-6, 1e-7));
  CHECK_FALSE(at::allclose(a, g, 1e-3, 1e-3));
  // The squared norm: fp64, one value on 1 and 2 threads, and the sum of squares to fp64 rounding.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one = rlx::grad_sq_norm({a});
  at::set_num_threads(2);
  const double two = rlx::grad_sq_norm({a});
  at::set_num_threads(threads);
  CHECK(one == two);
  CHECK(one == Approx(g.to(at::kDouble).pow(2).sum().item<double>()).epsilon(1e-12));
}
