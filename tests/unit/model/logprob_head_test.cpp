#include "rlx/model/logprob_head.hpp"

#include <catch2/catch.hpp>

// The chunked head against log_softmax over the whole logits: values and gradients, with
// chunks that do and do not divide the tokens, with and without entropy, fp32 and bf16.
TEST_CASE("logprob head: chunked log-probs and entropy equal the full log_softmax, gradients too", "[model]") {
  at::manual_seed(9);
  const int64_t V = 37, H = 12;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{1024}}) {
      INFO("dtype " << c10::toString(dtype) << " chunk " << chunk);
      auto h0 = at::randn({3, 7, H}).to(dtype), w0 = (at::randn({V, H}) * 0.5).to(dtype);
      auto targets = at::randint(V, {3, 7}, at::TensorOptions().dtype(at::kLong));
      auto a = at::randn({3, 7}), b = at::randn({3, 7});
      // Reference: the whole logits in the compute dtype, then fp32.
      auto h1 = h0.clone().requires_grad_(true), w1 = w0.clone().requires_grad_(true);
      auto logp_all = at::log_softmax(at::matmul(h1, w1.t()).to(at::kFloat), -1);
      auto ref_logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
      auto ref_ent = -(logp_all.exp() * logp_all).sum(-1);
      ((ref_logp * a).sum() + (ref_ent * b).sum()).backward();
      // Chunked.
      auto h2 = h0.clone().requires_grad_(true), w2 = w0.clone().requires_grad_(true);
      auto out = rlx::token_logprobs(h2, w2, targets, {.entropy = true, .chunk_tokens = chunk});
      REQUIRE(out.logprobs.sizes() == targets.sizes());
      REQUIRE(out.entropy.sizes() == targets.sizes());
      ((out.logprobs * a).sum() + (out.entropy * b).sum()).backward();
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      CHECK(at::allclose(out.logprobs, ref_logp, tol, tol));
      CHECK(at::allclose(out.entropy, ref_ent, tol, tol));
      CHECK(at::allclose(h2.grad().to(at::kFloat), h1.grad().to(at::kFloat), tol, tol));
      CHECK(at::allclose(w2.grad().to(at::kFloat), w1.grad().to(at::kFloat), tol, tol));
      // Log-probs alone (no entropy output used): the same values and hidden gradient.
      auto h3 = h0.clone().requires_grad_(true);
      auto only = rlx::token_logprobs(h3, w0, targets, {.chunk_tokens = chunk});
      CHECK(!only.entropy.defined());
      (only.logprobs * a).sum().backward();
      auto h4 = h0.clone().requires_grad_(true);
      (at::log_softmax(at::matmul(h4, w0.t()).to(at::kFloat), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * a)
          .sum()
          .backward();
      CHECK(at::allclose(h3.grad().to(at::kFloat), h4.grad().to(at::kFloat), tol, tol));
    }
  }
}

// The head at some positions only (a GRPO batch's trained tokens): those positions' values and
// gradients are the whole head's, the others read 0 and pass no gradient.
TEST_CASE("logprob head: at chosen positions only, the same values and gradients there, 0 elsewhere", "[model]") {
  at::manual_seed(4);
  const int64_t V = 29, H = 8;
  auto h0 = at::randn({2, 9, H}), w0 = at::randn({V, H}) * 0.5;
  auto targets = at::randint(V, {2, 9}, at::TensorOptions().dtype(at::kLong));
  auto mask = (at::rand({2, 9}) > 0.4).to(at::kFloat);
  auto a = at::randn({2, 9}), b = at::randn({2, 9});
  auto h1 = h0.clone().requires_grad_(true), w1 = w0.clone().requires_grad_(true);
  auto all = rlx::token_logprobs(h1, w1, targets, {.entropy = true, .chunk_tokens = 4});
  (((all.logprobs * a) + (all.entropy * b)) * mask).sum().backward();
  auto h2 = h0.clone().requires_grad_(true), w2 = w0.clone().requires_grad_(true);
  const auto positions = mask.reshape({-1}).nonzero().reshape({-1});
  REQUIRE(positions.numel() > 0);
  REQUIRE(positions.numel() < mask.numel());
  auto some = rlx::token_logprobs(h2, w2, targets, {.entropy = true, .chunk_tokens = 4, .positions = positions});
  ((some.logprobs * a) + (some.entropy * b)).sum().backward();  // no mask: the others are 0
  CHECK(at::allclose(some.logprobs, all.logprobs * mask, 1e-6, 1e-6));
  CHECK(at::allclose(some.entropy, all.entropy * mask, 1e-6, 1e-6));
  CHECK(at::equal(some.logprobs * (1 - mask), at::zeros_like(mask)));
  CHECK(at::allclose(h2.grad(), h1.grad(), 1e-6, 1e-6));
  CHECK(at::allclose(w2.grad(), w1.grad(), 1e-5, 1e-6));
}
