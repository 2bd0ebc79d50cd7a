#include "rlx/model/varlen_attention.hpp"

#include <catch2/catch.hpp>

#include "rlx/model/kv_cache.hpp"

namespace {
std::vector<int64_t> as_vector(const at::Tensor& t) {
  auto l = t.to(at::kLong).contiguous();
  return {l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel()};
}
}  // namespace

TEST_CASE("varlen attention: packed rows become sequences, padding runs included", "[model]") {
  auto segments = at::tensor({1, 1, 2, 2, 2, 0, 0, 3, 3, 3, 3, 0, 0, 0}, at::TensorOptions().dtype(at::kLong)).view({2, 7});
  const auto s = rlx::varlen_from_segments(segments, at::kCPU);
  CHECK(s.q_lens == std::vector<int64_t>{2, 3, 2, 4, 3});
  CHECK(s.k_lens == s.q_lens);
  CHECK(as_vector(s.cu_q) == std::vector<int64_t>{0, 2, 5, 7, 11, 14});
  CHECK(as_vector(s.cu_k) == as_vector(s.cu_q));
  CHECK(s.cu_q.scalar_type() == at::kInt);
  CHECK(s.max_q == 4);
  CHECK(s.max_k == 4);
  // Equal ids in different rows are different sequences; a row of one id is one sequence.
  const auto t = rlx::varlen_from_segments(at::ones({3, 5}, at::kLong), at::kCPU);
  CHECK(t.q_lens == std::vector<int64_t>{5, 5, 5});
  const std::vector<int64_t> q{1, 3}, k{4, 3};
  const auto e = rlx::varlen_seqs(q, k, at::kCPU);
  CHECK(as_vector(e.cu_q) == std::vector<int64_t>{0, 1, 4});
  CHECK(as_vector(e.cu_k) == std::vector<int64_t>{0, 4, 7});
  CHECK(e.total_q() == 4);
  CHECK(e.total_k() == 7);
}

// The learner's path: the same packed rows through varlen attention and through the
// segment mask give the same outputs and gradients at every real token (grouped heads).
TEST_CASE("varlen attention: equals the segment-masked attention on packed rows, values and gradients", "[model]") {
  at::manual_seed(11);
  const int64_t B = 2, T = 9, Hq = 6, Hkv = 2, D = 8;
  auto segments =
      at::tensor({1, 1, 1, 2, 2, 2, 2, 0, 0, 5, 5, 5, 5, 5, 5, 6, 6, 6}, at::TensorOptions().dtype(at::kLong)).view({B, T});
  auto q0 = at::randn({B, T, Hq, D}, at::kFloat), k0 = at::randn({B, T, Hkv, D}, at::kFloat),
       v0 = at::randn({B, T, Hkv, D}, at::kFloat);
  auto real = (segments > 0).view({B, T, 1, 1}).to(at::kFloat);
  auto weights = at::randn({B, T, Hq, D}, at::kFloat) * real;  // a loss over real tokens only

  auto q1 = q0.clone().requires_grad_(true), k1 = k0.clone().requires_grad_(true), v1 = v0.clone().requires_grad_(true);
  auto masked = rlx::attention(q1, k1, v1, rlx::segment_causal_mask(segments), 0.3);
  (masked * weights).sum().backward();

  auto q2 = q0.clone().requires_grad_(true), k2 = k0.clone().requires_grad_(true), v2 = v0.clone().requires_grad_(true);
  const auto seqs = rlx::varlen_from_segments(segments, at::kCPU);
  auto varlen = rlx::varlen_attention(q2.view({B * T, Hq, D}), k2.view({B * T, Hkv, D}), v2.view({B * T, Hkv, D}), seqs, 0.3)
                    .view({B, T, Hq, D});
  (varlen * weights).sum().backward();

  CHECK(at::allclose(masked * real, varlen * real, 1e-5, 1e-5));
  // Padding tokens' keys get no gradient either way (no real query sees them).
  CHECK(at::allclose(q1.grad(), q2.grad(), 1e-5, 1e-5));
  CHECK(at::allclose(k1.grad(), k2.grad(), 1e-5, 1e-5));
  CHECK(at::allclose(v1.grad(), v2.grad(), 1e-5, 1e-5));
  CHECK(q2.grad().abs().sum().item<double>() > 0);
}

// The engine's extend steps: Lq new queries after Lk - Lq cached keys are the last Lq rows
// of the full causal attention over all Lk tokens.
TEST_CASE("varlen attention: an extend step's queries equal the tail of the full prefill", "[model]") {
  at::manual_seed(12);
  const int64_t Hq = 4, Hkv = 1, D = 16;
  const std::vector<int64_t> q_lens{3, 1, 5}, k_lens{7, 4, 5};
  const auto seqs = rlx::varlen_seqs(q_lens, k_lens, at::kCPU);
  auto k = at::randn({seqs.total_k(), Hkv, D}), v = at::randn({seqs.total_k(), Hkv, D});
  auto q_full = at::randn({seqs.total_k(), Hq, D});  // a query for every key position
  std::vector<at::Tensor> tails;
  int64_t at_k = 0;
  for (size_t s = 0; s < q_lens.size(); ++s) {
    tails.push_back(q_full.narrow(0, at_k + k_lens[s] - q_lens[s], q_lens[s]));
    at_k += k_lens[s];
  }
  auto out = rlx::varlen_attention(at::cat(tails, 0), k, v, seqs, 0.25);
  const auto full = rlx::varlen_seqs(k_lens, k_lens, at::kCPU);
  auto ref = rlx::varlen_attention(q_full, k, v, full, 0.25);
  int64_t at_q = 0;
  at_k = 0;
  for (size_t s = 0; s < q_lens.size(); ++s) {
    INFO("sequence " << s);
    CHECK(at::allclose(out.narrow(0, at_q, q_lens[s]), ref.narrow(0, at_k + k_lens[s] - q_lens[s], q_lens[s]), 1e-6,
                       1e-6));
    at_q += q_lens[s];
    at_k += k_lens[s];
  }
  // Without a GPU the reference path ran (the flash kernel is checked against it in [cuda]).
  CHECK_FALSE(rlx::flash_varlen_supported(at::kCPU, at::kBFloat16, 64));
}

// A prompt shared by two sequences, packed once ([P | a | b], a and b naming P as their
// prefix), against each sequence alone ([P a] and [P b]): the same outputs at every token
// and, for the prompt's rows, the sum of the two copies' gradients; through the segment mask
// and through varlen attention's key index alike.
TEST_CASE("varlen attention: a shared prefix packed once equals each sequence with its own copy", "[model]") {
  at::manual_seed(13);
  const int64_t P = 5, A = 3, Bn = 2, Hq = 4, Hkv = 2, D = 8;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  auto qp = at::randn({P, Hq, D}), kp = at::randn({P, Hkv, D}), vp = at::randn({P, Hkv, D});
  auto qa = at::randn({A, Hq, D}), ka = at::randn({A, Hkv, D}), va = at::randn({A, Hkv, D});
  auto qb = at::randn({Bn, Hq, D}), kb = at::randn({Bn, Hkv, D}), vb = at::randn({Bn, Hkv, D});
  auto wp = at::randn({P, Hq, D}), wa = at::randn({A, Hq, D}), wb = at::randn({Bn, Hq, D});  // a loss's weights

  // Alone: each sequence with its copy of the prompt, causal.
  std::vector<at::Tensor> leaves;
  auto leaf = [&](const at::Tensor& t) { return leaves.emplace_back(t.clone().requires_grad_(true)); };
  auto alone = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const int64_t L = q.size(0);
    auto allowed = at::ones({L, L}, at::kBool).tril().unsqueeze(0);
    return rlx::attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), allowed, 0.3).squeeze(0);
  };
  auto qp1 = leaf(qp), kp1 = leaf(kp), vp1 = leaf(vp), qp2 = leaf(qp), kp2 = leaf(kp), vp2 = leaf(vp);
  auto qa0 = leaf(qa), ka0 = leaf(ka), va0 = leaf(va), qb0 = leaf(qb), kb0 = leaf(kb), vb0 = leaf(vb);
  auto oa = alone(at::cat({qp1, qa0}), at::cat({kp1, ka0}), at::cat({vp1, va0}));
  auto ob = alone(at::cat({qp2, qb0}), at::cat({kp2, kb0}), at::cat({vp2, vb0}));
  // The prompt's outputs are the same in both copies; the loss counts them once.
  CHECK(at::allclose(oa.narrow(0, 0, P), ob.narrow(0, 0, P), 1e-6, 1e-6));
  ((oa.narrow(0, 0, P) * wp).sum() + (oa.narrow(0, P, A) * wa).sum() + (ob.narrow(0, P, Bn) * wb).sum()).backward();

  auto segments = at::tensor({1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 0}, i64).view({1, 11});
  auto prefix = at::tensor({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0}, i64).view({1, 11});
  for (bool varlen : {false, true}) {
    INFO((varlen ? "varlen, key index" : "segment mask"));
    auto pad_q = at::zeros({1, Hq, D}), pad_kv = at::zeros({1, Hkv, D});
    auto q = at::cat({qp, qa, qb, pad_q}).requires_grad_(true), k = at::cat({kp, ka, kb, pad_kv}).requires_grad_(true),
         v = at::cat({vp, va, vb, pad_kv}).requires_grad_(true);
    at::Tensor out;
    if (varlen) {
      const auto seqs = rlx::varlen_from_segments(segments, at::kCPU, prefix);
      CHECK(seqs.q_lens == std::vector<int64_t>{P, A, Bn, 1});
      CHECK(seqs.k_lens == std::vector<int64_t>{P, P + A, P + Bn, 1});
      out = rlx::varlen_attention(q, k, v, seqs, 0.3);
    } else {
      out = rlx::attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), rlx::segment_causal_mask(segments, prefix), 0.3)
                .squeeze(0);
    }
    CHECK(at::allclose(out.narrow(0, 0, P + A), oa, 1e-5, 1e-6));
    CHECK(at::allclose(out.narrow(0, P + A, Bn), ob.narrow(0, P, Bn), 1e-5, 1e-6));
    (out.narrow(0, 0, P) * wp).sum().add((out.narrow(0, P, A) * wa).sum()).add((out.narrow(0, P + A, Bn) * wb).sum()).backward();
    CHECK(at::allclose(q.grad().narrow(0, 0, P), qp1.grad() + qp2.grad(), 1e-5, 1e-6));
    CHECK(at::allclose(k.grad().narrow(0, 0, P), kp1.grad() + kp2.grad(), 1e-5, 1e-6));
    CHECK(at::allclose(v.grad().narrow(0, 0, P), vp1.grad() + vp2.grad(), 1e-5, 1e-6));
    CHECK(at::allclose(k.grad().narrow(0, P, A), ka0.grad(), 1e-5, 1e-6));
    CHECK(at::allclose(q.grad().narrow(0, P + A, Bn), qb0.grad(), 1e-5, 1e-6));
    CHECK(at::allclose(v.grad().narrow(0, P + A, Bn), vb0.grad(), 1e-5, 1e-6));
    CHECK(kp2.grad().abs().sum().item<double>() > 0);  // b's loss reaches the prompt's keys
  }
  // A prefix that names no other segment of its row is refused, naming it.
  auto bad = at::tensor({0, 0, 0, 0, 0, 7, 7, 7, 7, 7, 0}, i64).view({1, 11});
  CHECK_THROWS_WITH(rlx::varlen_from_segments(segments, at::kCPU, bad), Catch::Contains("prefix segment 7"));
}
