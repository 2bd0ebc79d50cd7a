#include "rlx/model/fused_ops.hpp"

#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

// The fused CPU ops against their composite LibTorch forms: values and gradients, fp32 to
// rounding and bf16 to its precision, on shapes large enough to run on several threads.

namespace {
double tol(at::ScalarType t) { return t == at::kFloat ? 1e-5 : 2e-2; }

// fp32: elementwise to rounding. bf16: the two forms round intermediates at different
// places, so the bound is bf16's precision relative to the tensor's largest value.
void check_close(const at::Tensor& a, const at::Tensor& b, at::ScalarType t) {
  const auto af = a.to(at::kFloat), bf = b.to(at::kFloat);
  const float diff = (af - bf).abs().max().item<float>(), scale = bf.abs().max().item<float>();
  INFO("max abs difference " << diff << ", largest value " << scale);
  if (t == at::kFloat)
    CHECK(at::allclose(af, bf, tol(t), tol(t)));
  else
    CHECK(diff <= tol(t) * (scale + 1));
}
}  // namespace

TEST_CASE("fused rms_norm: values and gradients equal the composite form", "[model]") {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{700}}) {
      INFO("dtype " << c10::toString(dtype) << " rows " << rows);
      auto x0 = (at::randn({rows, 96}) * 3).to(dtype), w0 = (at::rand({96}) + 0.5).to(dtype);
      auto g = at::randn({rows, 96}).to(dtype);
      auto x1 = x0.clone().requires_grad_(true), w1 = w0.clone().requires_grad_(true);
      auto ref = rlx::fused::rms_norm_reference(x1, w1, 1e-6);
      ref.backward(g);
      auto x2 = x0.clone().requires_grad_(true), w2 = w0.clone().requires_grad_(true);
      auto out = rlx::fused::rms_norm(x2, w2, 1e-6);
      REQUIRE(out.sizes() == x0.sizes());
      REQUIRE(out.scalar_type() == dtype);
      out.backward(g);
      check_close(out, ref, dtype);
      check_close(x2.grad(), x1.grad(), dtype);
      // The weight gradient sums over rows: bf16 inputs, fp32 sums, a looser bound for bf16's rows.
      CHECK(at::allclose(w2.grad().to(at::kFloat), w1.grad().to(at::kFloat), tol(dtype), dtype == at::kFloat ? 1e-4 : 0.1));
    }
  }
}

TEST_CASE("fused rms_norm: the weight gradient does not depend on the thread count", "[model]") {
  at::manual_seed(4);
  auto x0 = at::randn({1000, 64}), w0 = at::rand({64}), g = at::randn({1000, 64});
  const int threads = at::get_num_threads();
  std::vector<at::Tensor> grads;
  for (int n : {1, 2}) {
    at::set_num_threads(n);
    auto w = w0.clone().requires_grad_(true);
    rlx::fused::rms_norm(x0, w, 1e-6).backward(g);
    grads.push_back(w.grad());
  }
  at::set_num_threads(threads);
  CHECK(at::equal(grads[0], grads[1]));
}

TEST_CASE("fused rope: rotation, scale and its adjoint equal the composite form", "[model]") {
  at::manual_seed(5);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (double scale : {1.0, 0.25}) {
      INFO("dtype " << c10::toString(dtype) << " scale " << scale);
      const int64_t B = 3, T = 45, H = 6, D = 32;
      auto pos = at::randint(0, 500, {B, T}).to(at::kFloat).unsqueeze(-1);
      auto inv = 1.0 / at::pow(10000.0, at::arange(0, D, 2).to(at::kFloat) / D);
      auto emb = at::cat({pos * inv, pos * inv}, -1);
      auto cos = emb.cos().to(dtype), sin = emb.sin().to(dtype);
      // x as the view of a wider projection output (q inside [q | k | v]): strided heads.
      auto wide = at::randn({B, T, H * D + 2 * D}).to(dtype);
      auto g = at::randn({B, T, H, D}).to(dtype);
      auto w1 = wide.clone().requires_grad_(true);
      auto ref = rlx::fused::rope_reference(w1.narrow(-1, 0, H * D).view({B, T, H, D}), cos, sin, scale);
      ref.backward(g);
      auto w2 = wide.clone().requires_grad_(true);
      auto x2 = w2.narrow(-1, 0, H * D).view({B, T, H, D});
      REQUIRE(!x2.is_contiguous());
      auto out = rlx::fused::rope(x2, cos, sin, scale);
      REQUIRE(out.is_contiguous());
      out.backward(g.transpose(1, 2).contiguous().transpose(1, 2));  // a gradient in another layout
      check_close(out, ref, dtype);
      check_close(w2.grad(), w1.grad(), dtype);
    }
  }
}

TEST_CASE("fused silu_mul: values and gradients equal silu(gate) * up", "[model]") {
  at::manual_seed(6);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << c10::toString(dtype));
    auto gu0 = (at::randn({5, 130, 2 * 88}) * 4).to(dtype);
    auto g = at::randn({5, 130, 88}).to(dtype);
    auto a = gu0.clone().requires_grad_(true);
    auto ref = rlx::fused::silu_mul_reference(a);
    ref.backward(g);
    auto b = gu0.clone().requires_grad_(true);
    auto out = rlx::fused::silu_mul(b);
    REQUIRE(out.sizes() == ref.sizes());
    out.backward(g);
    check_close(out, ref, dtype);
    check_close(b.grad(), a.grad(), dtype);
  }
}

TEST_CASE("fused join_rows: parts back to back are one view, apart a copy; gradients to each part", "[model]") {
  at::manual_seed(5);
  auto x = at::randn({6, 8});
  auto g = at::randn({6, 4 + 2 + 2});
  // What the gradients of [q; k; v] are through a copy: the reference.
  std::vector<at::Tensor> apart{at::randn({4, 8}).requires_grad_(true), at::randn({2, 8}).requires_grad_(true),
                                at::randn({2, 8}).requires_grad_(true)};
  auto copied = rlx::fused::join_rows({apart[0], apart[1], apart[2]});
  CHECK(copied.data_ptr() != apart[0].data_ptr());
  at::linear(x, copied).backward(g);
  // The same values as views of one buffer (as an FSDP unit lays a block's projections out).
  auto flat = at::empty({8 * 8}).requires_grad_(false);
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto& p : apart) {
    auto v = at::empty({0}).set_(flat.storage(), offset, p.sizes(), c10::contiguous_strides(p.sizes()));
    {
      c10::NoGradGuard no_grad;
      v.copy_(p);
    }
    views.push_back(v.requires_grad_(true));
    offset += p.numel();
  }
  auto joined = rlx::fused::join_rows({views[0], views[1], views[2]});
  CHECK(joined.data_ptr() == flat.data_ptr());  // no copy
  REQUIRE(joined.sizes() == copied.sizes());
  CHECK(at::equal(joined, copied));
  at::linear(x, joined).backward(g);
  for (size_t i = 0; i < views.size(); ++i) {
    INFO("part " << i);
    REQUIRE(views[i].grad().defined());
    CHECK(at::equal(views[i].grad(), apart[i].grad()));
  }
  // Out of order, or with a gap, they are apart: a copy, the same values.
  auto swapped = rlx::fused::join_rows({views[1], views[0]});
  CHECK(swapped.data_ptr() != flat.data_ptr());
  CHECK(at::equal(swapped, at::cat({views[1], views[0]}, 0)));
  CHECK(rlx::fused::join_rows({views[0], views[2]}).data_ptr() != flat.data_ptr());
  CHECK_FALSE(rlx::fused::join_rows({at::Tensor(), at::Tensor()}).defined());
}
