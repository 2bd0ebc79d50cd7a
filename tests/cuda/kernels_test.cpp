// The rollout kernels (rlx/cuda/kernels.hpp) on a GPU against their CPU references:
// decode attention, the sampler (against the CPU sampler, token for token), the norms and
// RoPE + KV append, in fp32, fp16 and bf16; and a row's result alone equal, bit for bit, to
// the same row inside a batch. Runs where a GPU is (scripts/cuda_check.sh); on a CPU
// machine with nvcc it is compiled only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "rlx/cuda/attention_math.hpp"
#include "rlx/cuda/kernels.hpp"
#include "rlx/cuda/reference.hpp"
#include "rlx/rollout/sampling.hpp"

using rlx::cuda::DType;

namespace {

void cuda_ok(cudaError_t e) { REQUIRE(std::string(cudaGetErrorString(e)) == cudaGetErrorString(cudaSuccess)); }
void launch_ok(int status) { REQUIRE(std::string(rlx::cuda::error_string(status)) == cudaGetErrorString(cudaSuccess)); }

// Host values stored as `dtype` (2 or 4 bytes each) and back.
std::vector<uint8_t> encode(const std::vector<float>& v, DType dtype) {
  const size_t w = dtype == DType::f32 ? 4 : 2;
  std::vector<uint8_t> out(v.size() * w);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::f32) std::memcpy(&out[i * 4], &v[i], 4);
    if (dtype == DType::f16) { const __half h = __float2half(v[i]); std::memcpy(&out[i * 2], &h, 2); }
    if (dtype == DType::bf16) { const __nv_bfloat16 h = __float2bfloat16(v[i]); std::memcpy(&out[i * 2], &h, 2); }
  }
  return out;
}
std::vector<float> decode(const std::vector<uint8_t>& b, DType dtype) {
  const size_t w = dtype == DType::f32 ? 4 : 2;
  std::vector<float> out(b.size() / w);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::f32) std::memcpy(&out[i], &b[i * 4], 4);
    if (dtype == DType::f16) { __half h; std::memcpy(&h, &b[i * 2], 2); out[i] = __half2float(h); }
    if (dtype == DType::bf16) { __nv_bfloat16 h; std::memcpy(&h, &b[i * 2], 2); out[i] = __bfloat162float(h); }
  }
  return out;
}
// What storing in dtype does to the values (the references get the rounded inputs).
std::vector<float> rounded(const std::vector<float>& v, DType dtype) { return decode(encode(v, dtype), dtype); }

struct Device {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Device(size_t n) : bytes(n) { cuda_ok(cudaMalloc(&p, std::max<size_t>(n, 1))); }
  template <class T>
  explicit Device(const std::vector<T>& v) : Device(v.size() * sizeof(T)) {
    cuda_ok(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  template <class T>
  std::vector<T> get() const {
    std::vector<T> v(bytes / sizeof(T));
    cuda_ok(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost));
    return v;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

double tolerance(DType d) { return d == DType::f32 ? 1e-4 : d == DType::f16 ? 4e-3 : 3e-2; }
const char* name(DType d) { return d == DType::f32 ? "f32" : d == DType::f16 ? "f16" : "bf16"; }

struct AttentionCase {
  int q_heads, kv_heads, head_dim;
  std::vector<int32_t> lens;
};

// A case's paged pool in `dtype`, on the host and the device: block tables a shuffled
// permutation of the pool (neighbours far apart; `spare` blocks no sequence uses), keys and
// values N(0, 1), queries x 4 (scores of spread ~4, a peaked softmax, outputs of the values'
// magnitude: not the near-zero mean of a flat softmax, under which a dropped split would hide).
struct AttentionInputs {
  int max_blocks;
  std::vector<int32_t> tables;
  std::vector<float> k, v, q;
  Device kp, vp;
};
AttentionInputs attention_inputs(const AttentionCase& c, int block_size, DType dtype, int spare, std::mt19937& g) {
  const int batch = static_cast<int>(c.lens.size()), d = c.head_dim;
  const int max_blocks = (*std::max_element(c.lens.begin(), c.lens.end()) + block_size - 1) / block_size;
  const int num_blocks = batch * max_blocks + spare;
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), g);
  tables.resize(static_cast<size_t>(batch) * max_blocks);
  const size_t pool = static_cast<size_t>(num_blocks) * c.kv_heads * block_size * d;
  auto k = rounded(randn(pool, g), dtype), v = rounded(randn(pool, g), dtype);
  auto q = rounded(randn(static_cast<size_t>(batch) * c.q_heads * d, g, 4.0f), dtype);
  return {max_blocks, std::move(tables), k, v, std::move(q), Device(encode(k, dtype)), Device(encode(v, dtype))};
}

// Runs decode attention for the sequences `rows` of a case; returns the output as floats.
std::vector<float> run_decode(DType dtype, const AttentionCase& c, const std::vector<float>& q, const Device& kp,
                              const Device& vp, const std::vector<int32_t>& tables, int max_blocks, int block_size,
                              const std::vector<int>& rows, rlx::cuda::DecodeAttentionKernel kernel,
                              bool merge_in_pass1 = false) {
  const int d = c.head_dim;
  std::vector<float> qs;
  std::vector<int32_t> ts, ls;
  for (int r : rows) {
    qs.insert(qs.end(), q.begin() + static_cast<int64_t>(r) * c.q_heads * d, q.begin() + static_cast<int64_t>(r + 1) * c.q_heads * d);
    ts.insert(ts.end(), tables.begin() + static_cast<int64_t>(r) * max_blocks, tables.begin() + static_cast<int64_t>(r + 1) * max_blocks);
    ls.push_back(c.lens[static_cast<size_t>(r)]);
  }
  const int batch = static_cast<int>(rows.size()), max_context = max_blocks * block_size;
  Device dq(encode(qs, dtype)), dt(ts), dl(ls);
  Device out(static_cast<size_t>(batch) * c.q_heads * d * (dtype == DType::f32 ? 4 : 2));
  Device ws(rlx::cuda::decode_attention_workspace(batch, c.q_heads, d, max_context) * sizeof(float));
  rlx::cuda::DecodeAttentionArgs a{.dtype = dtype, .q = dq.p, .k_pool = kp.p, .v_pool = vp.p,
                                   .block_tables = dt.as<int32_t>(), .context_lens = dl.as<int32_t>(), .out = out.p,
                                   .workspace = ws.as<float>(), .batch = batch, .q_heads = c.q_heads,
                                   .kv_heads = c.kv_heads, .head_dim = d, .block_size = block_size,
                                   .max_blocks = max_blocks, .max_context = max_context,
                                   .scale = 1.0f / std::sqrt(static_cast<float>(d)),
                                   .kernel = kernel};
  const size_t counters = rlx::cuda::decode_attention_counters(batch, c.q_heads, c.kv_heads);
  Device dc(std::vector<int32_t>(counters, 0));
  if (merge_in_pass1) a.merge_counters = dc.as<int32_t>();
  launch_ok(rlx::cuda::decode_attention(a, nullptr));
  cuda_ok(cudaDeviceSynchronize());
  CHECK(dc.get<int32_t>() == std::vector<int32_t>(counters, 0));  // left zero for the next call
  return decode(out.get<uint8_t>(), dtype);
}

}  // namespace

TEST_CASE("cuda kernels: paged decode attention equals the reference, a row alone equals it in the batch", "[cuda]") {
  std::mt19937 g(3);
  // GQA groups of 7, 16 (two full chunks of 8 heads), 1, 8 and 12 (a chunk of 4 after the
  // first); block sizes that do and do not divide the tiled kernel's 128-token window.
  const std::vector<AttentionCase> cases{AttentionCase{14, 2, 64, {1, 127, 128, 129, 700, 40}},
                                         AttentionCase{16, 1, 128, {300, 5, 1}}, AttentionCase{4, 4, 64, {257, 33}},
                                         AttentionCase{16, 2, 128, {31, 32, 33, 96, 1025}},
                                         AttentionCase{12, 1, 128, {200, 3}}};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const AttentionCase& c = cases[ci];
    for (int block_size : ci == 0 || ci == 4 ? std::vector<int>{16, 1, 48, 256} : std::vector<int>{16}) {
      for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        INFO(name(dtype) << " q_heads " << c.q_heads << " kv_heads " << c.kv_heads << " head_dim " << c.head_dim
                         << " block_size " << block_size);
        const int batch = static_cast<int>(c.lens.size()), d = c.head_dim;
        const auto in = attention_inputs(c, block_size, dtype, 3, g);
        const int max_blocks = in.max_blocks;
        const auto& tables = in.tables;
        const auto &k = in.k, &v = in.v, &q = in.q;
        const Device &kp = in.kp, &vp = in.vp;

        std::vector<int> all(static_cast<size_t>(batch));
        std::iota(all.begin(), all.end(), 0);
        std::vector<float> want(static_cast<size_t>(batch) * c.q_heads * d);
        rlx::cuda::reference::decode_attention(
            q.data(), k.data(), v.data(), tables.data(), c.lens.data(), want.data(),
            {batch, c.q_heads, c.kv_heads, d, block_size, max_blocks, 1.0f / std::sqrt(static_cast<float>(d))});
        // Every pass-1 kernel (fp32 runs the split one whichever is asked for). The tensor-core
        // one rounds the softmax weights to the dtype before the values' product (as flash
        // attention does): within the dtype's tolerance of the reference, not of the others.
        using Kernel = rlx::cuda::DecodeAttentionKernel;
        std::vector<std::vector<float>> outs;
        for (auto kernel : {Kernel::tiled, Kernel::split, Kernel::mma}) {
          INFO("kernel " << (kernel == Kernel::tiled ? "tiled" : kernel == Kernel::split ? "split" : "mma"));
          auto got = run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, all, kernel);
          CHECK(max_abs_diff(got, want) <= tolerance(dtype));
          // Row 0 alone: the same bits as inside the batch.
          auto alone = run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, {0}, kernel);
          CHECK(std::equal(alone.begin(), alone.end(), got.begin()));
          if (kernel == Kernel::mma) {  // the splits merged by pass 1's last block: pass 2's values
            CHECK(run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, all, kernel, true) == got);
            CHECK(run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, {0}, kernel, true) == alone);
          }
          outs.push_back(std::move(got));
        }
        // The sequence kernel: the tensor-core kernel's splits merged as pass 2 merges them, bit for bit.
        CHECK(run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, all, Kernel::mma_sequence) == outs[2]);
        CHECK(run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, {0}, Kernel::mma_sequence) ==
              std::vector<float>(outs[2].begin(), outs[2].begin() + static_cast<int64_t>(c.q_heads) * d));
        // The tiled and split kernels differ in their fp32 sums' order only: within 2 units in the last
        // place of the output's dtype, relative to its largest value.
        double top = 0;
        for (float x : outs[1]) top = std::max(top, std::abs(static_cast<double>(x)));
        const double ulp = dtype == DType::bf16  ? std::ldexp(1.0, -8)
                           : dtype == DType::f16 ? std::ldexp(1.0, -11)
                                                 : 1e-6;
        CHECK(max_abs_diff(outs[0], outs[1]) <= 2 * ulp * std::max(top, 1.0));
      }
    }
  }
}

TEST_CASE("cuda kernels: decode attention a block a sequence equals the two passes bit for bit, long contexts",
          "[cuda]") {
  // Many splits a sequence (up to 32), so that the merges' roundings are exercised: the
  // per-sequence kernel folds the same partial results in the same order with the same
  // roundings as pass 2 (merge_step), and a row alone gives its bits in the batch.
  std::mt19937 g(11);
  const std::vector<AttentionCase> cases{AttentionCase{14, 2, 64, {4096, 2000, 129, 1, 3000, 640, 2500, 1024}},
                                         AttentionCase{16, 2, 128, {4096, 1500, 257, 3333}}};
  for (const AttentionCase& c : cases) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      INFO(name(dtype) << " q_heads " << c.q_heads << " head_dim " << c.head_dim);
      const int batch = static_cast<int>(c.lens.size()), d = c.head_dim, block_size = 16;
      const auto in = attention_inputs(c, block_size, dtype, 0, g);
      const int max_blocks = in.max_blocks;
      const auto& tables = in.tables;
      const auto& q = in.q;
      const Device &kp = in.kp, &vp = in.vp;
      std::vector<int> all(static_cast<size_t>(batch));
      std::iota(all.begin(), all.end(), 0);
      using Kernel = rlx::cuda::DecodeAttentionKernel;
      const auto two_pass = run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, all, Kernel::mma);
      CHECK(run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, all, Kernel::mma_sequence) == two_pass);
      const auto row = static_cast<int64_t>(c.q_heads) * d;
      CHECK(run_decode(dtype, c, q, kp, vp, tables, max_blocks, block_size, {2}, Kernel::mma_sequence) ==
            std::vector<float>(two_pass.begin() + 2 * row, two_pass.begin() + 3 * row));
    }
  }
}

// Rows of Qwen's vocabulary (16-byte aligned: the sampler's vector loads) and rows of odd
// widths and strides (element loads on misaligned rows, a short last vector on aligned ones;
// at 10007 several units a thread in every pass and in the draw's chunks), where a row alone
// starts aligned but not inside the batch: its token and log-prob the same.
TEST_CASE("cuda kernels: the sampler draws the CPU sampler's tokens, a row alone equals it in the batch", "[cuda]") {
  std::mt19937 g(5);
  for (auto [vocab, stride, rows] :
       {std::tuple{151936, 151936, 64}, std::tuple{1001, 1003, 24}, std::tuple{10007, 10011, 24}}) {
    // f16 at the small widths only: the sanitizers run this test too, the large rows twice is enough.
    const bool large = vocab > 100000;
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      if (large && dtype == DType::f16) continue;
      INFO(name(dtype) << " vocab " << vocab << " stride " << stride);
      auto logits = rounded(randn(static_cast<size_t>(rows) * stride, g, 3.0f), dtype);
      std::vector<float> temperature, min_p;
      std::vector<int32_t> top_k;
      std::vector<double> top_p, uniform;
      std::vector<rlx::SamplingParams> params;
      for (int r = 0; r < rows; ++r) {
        rlx::SamplingParams p;
        p.temperature = r % 8 == 0 ? 0.0 : 0.6 + 0.1 * (r % 7);
        p.top_k = r % 3 == 0 ? 0 : 1 + (r * 37) % 200;
        p.top_p = r % 4 == 0 ? 1.0 : 0.5 + 0.05 * (r % 10);
        p.min_p = r % 5 == 0 ? 0.05 : 0.0;
        params.push_back(p);
        temperature.push_back(static_cast<float>(p.temperature));
        top_k.push_back(static_cast<int32_t>(p.top_k));
        top_p.push_back(p.top_p);
        min_p.push_back(static_cast<float>(p.min_p));
        uniform.push_back(rlx::sampling_uniform(9, "kernels", r, 0));
      }
      // Rows [first, first + n); `slices` < 0: one block a row, else the slices' path (0: as many
      // as fill the device); `plain`: every row without top-k, top-p and min-p.
      auto run = [&](int first, int n, int slices = -1, bool plain = false) {
        Device x(encode(std::vector<float>(logits.begin() + static_cast<int64_t>(first) * stride,
                                           logits.begin() + static_cast<int64_t>(first + n) * stride),
                        dtype));
        auto slice = [&](const auto& v) { return std::vector(v.begin() + first, v.begin() + first + n); };
        Device dt(slice(temperature)), du(slice(uniform));
        Device dk(plain ? std::vector<int32_t>(static_cast<size_t>(n), 0) : slice(top_k));
        Device dp(plain ? std::vector<double>(static_cast<size_t>(n), 1.0) : slice(top_p));
        Device dm(plain ? std::vector<float>(static_cast<size_t>(n), 0.0f) : slice(min_p));
        Device tokens(static_cast<size_t>(n) * 8), logprobs(static_cast<size_t>(n) * 4);
        Device workspace(slices < 0 ? 1 : rlx::cuda::sample_workspace_bytes(n));
        rlx::cuda::SampleArgs a{.dtype = dtype,
                                .logits = x.p,
                                .row_stride = stride,
                                .rows = n,
                                .vocab = vocab,
                                .temperature = dt.as<float>(),
                                .top_k = dk.as<int32_t>(),
                                .top_p = dp.as<double>(),
                                .min_p = dm.as<float>(),
                                .uniform = du.as<double>(),
                                .tokens = tokens.as<int64_t>(),
                                .logprobs = logprobs.as<float>(),
                                .workspace = slices < 0 ? nullptr : workspace.p,
                                .slices = slices < 0 ? 0 : slices};
        launch_ok(rlx::cuda::sample(a, nullptr));
        cuda_ok(cudaDeviceSynchronize());
        return std::pair{tokens.get<int64_t>(), logprobs.get<float>()};
      };
      auto [tokens, logprobs] = run(0, rows);
      int differ = 0;
      for (int r = 0; r < rows; ++r) {
        auto cpu = rlx::sample_row(logits.data() + static_cast<int64_t>(r) * stride, vocab,
                                   params[static_cast<size_t>(r)], uniform[static_cast<size_t>(r)]);
        differ += cpu.token != tokens[static_cast<size_t>(r)];
        CHECK(std::abs(cpu.logprob - logprobs[static_cast<size_t>(r)]) <= 1e-3);
      }
      CHECK(differ == 0);         // "up to ties": a tie needs an exp rounding right at a boundary
      for (int r : {5, 9, 13}) {  // misaligned in the odd batch (aligned alone)
        auto [one_token, one_logprob] = run(r, 1);
        CHECK(one_token[0] == tokens[static_cast<size_t>(r)]);
        CHECK(one_logprob[0] == logprobs[static_cast<size_t>(r)]);
      }
      // The slices' path: the same bits for any number of slices (integer sums), the filtered
      // rows unchanged, the plain rows (greedy ones included) the CPU sampler's.
      // (the large rows at the automatic count only: the sanitizers run this test too)
      const auto some = large ? std::vector<int>{0} : std::vector<int>{0, 1, 7, rlx::cuda::kSampleMaxSlices};
      for (int slices : some) {
        INFO("slices " << slices);
        auto [t, l] = run(0, rows, slices);
        CHECK(t == tokens);
        CHECK(l == logprobs);
      }
      auto [plain_tokens, plain_logprobs] = run(0, rows, -1, true);
      differ = 0;
      for (int r = 0; r < rows; ++r) {
        auto p = params[static_cast<size_t>(r)];
        p.top_k = 0, p.top_p = 1.0, p.min_p = 0.0;
        auto cpu = rlx::sample_row(logits.data() + static_cast<int64_t>(r) * stride, vocab, p,
                                   uniform[static_cast<size_t>(r)]);
        differ += cpu.token != plain_tokens[static_cast<size_t>(r)];
        CHECK(std::abs(cpu.logprob - plain_logprobs[static_cast<size_t>(r)]) <= 1e-3);
      }
      CHECK(differ == 0);
      for (int slices : large ? std::vector<int>{0} : std::vector<int>{0, 3, rlx::cuda::kSampleMaxSlices}) {
        INFO("plain rows, slices " << slices);
        auto [t, l] = run(0, rows, slices, true);
        CHECK(t == plain_tokens);
        CHECK(l == plain_logprobs);
        auto [one_token, one_logprob] = run(9, 1, slices, true);  // misaligned in the batch, aligned alone
        CHECK(one_token[0] == plain_tokens[9]);
        CHECK(one_logprob[0] == plain_logprobs[9]);
      }
    }
  }
}

TEST_CASE("cuda kernels: residual add + RMSNorm, SiLU-and-multiply, RoPE + KV append equal their references", "[cuda]") {
  std::mt19937 g(7);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    INFO(name(dtype));
    const size_t w = dtype == DType::f32 ? 4 : 2;
    // 16-byte vectors, 1, 2 and 4 a thread (at 16 bits; fp32 rows are twice the vectors: 8000
    // goes element by element), and element by element (902: not a multiple of a vector).
    for (int hidden : {896, 4096, 8000, 902}) {
      INFO("add_rms_norm hidden " << hidden);
      const int rows = 5;
      auto res = rounded(randn(static_cast<size_t>(rows) * hidden, g), dtype);
      auto x = rounded(randn(res.size(), g), dtype);
      auto weight = rounded(randn(static_cast<size_t>(hidden), g), dtype);
      Device dr(encode(res, dtype)), dx(encode(x, dtype)), dw(encode(weight, dtype)), out(res.size() * w);
      launch_ok(rlx::cuda::add_rms_norm({.dtype = dtype, .residual = dr.p, .x = dx.p, .weight = dw.p, .out = out.p,
                                         .rows = rows, .hidden = hidden, .eps = 1e-6f},
                                        nullptr));
      cuda_ok(cudaDeviceSynchronize());
      std::vector<float> want(res.size());
      rlx::cuda::reference::add_rms_norm(res.data(), x.data(), weight.data(), want.data(), rows, hidden, 1e-6f);
      CHECK(max_abs_diff(decode(dr.get<uint8_t>(), dtype), res) <= tolerance(dtype) * 2);
      CHECK(max_abs_diff(decode(out.get<uint8_t>(), dtype), want) <= tolerance(dtype) * 8);
      // Nothing to add (a layer's input norm, the final norm): the residual is only read.
      const auto before = dr.get<uint8_t>();
      launch_ok(rlx::cuda::add_rms_norm({.dtype = dtype, .residual = dr.p, .x = nullptr, .weight = dw.p, .out = out.p,
                                         .rows = rows, .hidden = hidden, .eps = 1e-6f},
                                        nullptr));
      cuda_ok(cudaDeviceSynchronize());
      rlx::cuda::reference::add_rms_norm(res.data(), nullptr, weight.data(), want.data(), rows, hidden, 1e-6f);
      CHECK(dr.get<uint8_t>() == before);
      CHECK(max_abs_diff(decode(out.get<uint8_t>(), dtype), want) <= tolerance(dtype) * 8);
    }
    for (int inter : {4864, 37}) {  // 16-byte vectors; element by element
      INFO("silu_mul inter " << inter);
      const int rows = 3;
      auto gu = rounded(randn(static_cast<size_t>(rows) * 2 * inter, g), dtype);
      Device dgu(encode(gu, dtype)), out(static_cast<size_t>(rows) * inter * w);
      launch_ok(rlx::cuda::silu_mul(dtype, dgu.p, out.p, rows, inter, nullptr));
      cuda_ok(cudaDeviceSynchronize());
      std::vector<float> want(static_cast<size_t>(rows) * inter);
      rlx::cuda::reference::silu_mul(gu.data(), want.data(), rows, inter);
      CHECK(max_abs_diff(decode(out.get<uint8_t>(), dtype), want) <= tolerance(dtype) * 8);
    }
    // Qwen2.5-0.5B's heads (a thread a rotated pair, 512); Qwen3-32B-like (2048 pairs: two a
    // thread, fewer warps than heads for the norms); the fewest (32 threads, 4 pairs).
    for (auto [q_heads, kv_heads, d] : {std::tuple{14, 2, 64}, std::tuple{28, 4, 128}, std::tuple{1, 1, 8}}) {
      INFO("rope_append q heads " << q_heads << " kv heads " << kv_heads << " head_dim " << d);
      const int rows = 4, block_size = 16, num_blocks = 6;
      auto qkv = rounded(randn(static_cast<size_t>(rows) * (q_heads + 2 * kv_heads) * d, g), dtype);
      std::vector<int64_t> positions{0, 17, 511, 4000}, slots{5, 16 * 3 + 2, 16 * 5 + 15, 1};
      std::vector<float> inv_freq(d / 2);
      for (int i = 0; i < d / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(1e6f, -2.0f * i / d);
      const size_t pool = static_cast<size_t>(num_blocks) * kv_heads * block_size * d;
      Device dqkv(encode(qkv, dtype)), dpos(positions), dslot(slots), dfreq(inv_freq);
      Device q_out(static_cast<size_t>(rows) * q_heads * d * w), kp(encode(std::vector<float>(pool), dtype)),
          vp(encode(std::vector<float>(pool), dtype));
      // Qwen3's per-head q/k RMSNorm first when the weights are given.
      auto rope_append = [&](const void* q_norm, const void* k_norm) {
        return rlx::cuda::rope_append({.dtype = dtype,
                                       .qkv = dqkv.p,
                                       .positions = dpos.as<int64_t>(),
                                       .slots = dslot.as<int64_t>(),
                                       .inv_freq = dfreq.as<float>(),
                                       .q_out = q_out.p,
                                       .k_pool = kp.p,
                                       .v_pool = vp.p,
                                       .rows = rows,
                                       .q_heads = q_heads,
                                       .kv_heads = kv_heads,
                                       .head_dim = d,
                                       .block_size = block_size,
                                       .q_norm = q_norm,
                                       .k_norm = k_norm,
                                       .norm_eps = 1e-6f},
                                      nullptr);
      };
      launch_ok(rope_append(nullptr, nullptr));
      cuda_ok(cudaDeviceSynchronize());
      std::vector<float> want_q(static_cast<size_t>(rows) * q_heads * d), want_k(pool), want_v(pool);
      rlx::cuda::reference::rope_append(qkv.data(), positions.data(), slots.data(), inv_freq.data(), want_q.data(),
                                        want_k.data(), want_v.data(), rows, q_heads, kv_heads, d, block_size);
      CHECK(max_abs_diff(decode(q_out.get<uint8_t>(), dtype), want_q) <= tolerance(dtype) * 8);
      CHECK(max_abs_diff(decode(kp.get<uint8_t>(), dtype), want_k) <= tolerance(dtype) * 8);
      CHECK(max_abs_diff(decode(vp.get<uint8_t>(), dtype), want_v) == 0.0);
      // With the norms: values of rms ~1 times weights near 1, so the same bound holds (two
      // more roundings of values under 6).
      auto qw = randn(static_cast<size_t>(d), g, 0.2f), kw = randn(static_cast<size_t>(d), g, 0.2f);
      for (auto* v : {&qw, &kw})
        for (auto& x : *v) x += 1.0f;
      qw = rounded(qw, dtype), kw = rounded(kw, dtype);
      Device dqw(encode(qw, dtype)), dkw(encode(kw, dtype));
      launch_ok(rope_append(dqw.p, dkw.p));
      cuda_ok(cudaDeviceSynchronize());
      rlx::cuda::reference::rope_append(qkv.data(), positions.data(), slots.data(), inv_freq.data(), want_q.data(),
                                        want_k.data(), want_v.data(), rows, q_heads, kv_heads, d, block_size, qw.data(),
                                        kw.data(), 1e-6f);
      CHECK(max_abs_diff(decode(q_out.get<uint8_t>(), dtype), want_q) <= tolerance(dtype) * 8);
      CHECK(max_abs_diff(decode(kp.get<uint8_t>(), dtype), want_k) <= tolerance(dtype) * 8);
      CHECK(rope_append(dqw.p, nullptr) != 0);  // one of the two weights alone is refused
    }
  }
}

namespace {

// A projection kernel (gemv or decode_gemm) on x [m, k], w [n, k] and b [n] drawn and rounded
// to dtype: its output against the fp64 sum of those rounded inputs (bf16/fp16 round once: 2^-8
// / 2^-11 of |y|, |y| up to ~4 sqrt(k) / 8 here), and row `alone` of x by itself giving the bits
// it gives among the rows.
void check_projection(int (*kernel)(const rlx::cuda::GemvArgs&, void*), int m, int n, int k, bool bias, int alone,
                      DType dtype, std::mt19937& g) {
  const auto x = rounded(randn(static_cast<size_t>(m) * k, g), dtype);
  const auto w = rounded(randn(static_cast<size_t>(n) * k, g, 0.125f), dtype);
  const auto b = rounded(randn(static_cast<size_t>(n), g), dtype);
  std::vector<float> want(static_cast<size_t>(m) * n);
  double scale = 0;
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      double s = bias ? b[static_cast<size_t>(c)] : 0.0;
      for (int j = 0; j < k; ++j)
        s += static_cast<double>(x[static_cast<size_t>(r) * k + j]) * w[static_cast<size_t>(c) * k + j];
      want[static_cast<size_t>(r) * n + c] = static_cast<float>(s);
      scale = std::max(scale, std::abs(s));
    }
  Device dw(encode(w, dtype)), db(encode(b, dtype));
  auto run = [&](int rows, const std::vector<float>& xs) {
    Device dx(encode(xs, dtype)), out(static_cast<size_t>(rows) * n * 2);
    launch_ok(kernel(
        {.dtype = dtype, .x = dx.p, .w = dw.p, .bias = bias ? db.p : nullptr, .out = out.p, .m = rows, .n = n, .k = k},
        nullptr));
    cuda_ok(cudaDeviceSynchronize());
    return decode(out.get<uint8_t>(), dtype);
  };
  const auto got = run(m, x);
  CHECK(max_abs_diff(got, want) <= (dtype == DType::bf16 ? 8e-3 : 1e-3) * std::max(scale, 1.0));
  const auto row =
      std::vector<float>(x.begin() + static_cast<int64_t>(alone) * k, x.begin() + (alone + 1) * int64_t{k});
  const auto one = run(1, row);
  CHECK(std::equal(one.begin(), one.end(), got.begin() + static_cast<int64_t>(alone) * n));
}

// A projection kernel with SiLU-mul on the way in (gate_up [m, 2 k] drawn), against silu_mul and
// then the same kernel on its output: the same bytes, and gate_up not written.
void check_silu_fold(int (*kernel)(const rlx::cuda::GemvArgs&, void*), int m, int n, int k, bool bias, DType dtype,
                     std::mt19937& g) {
  const auto gate_up = encode(randn(static_cast<size_t>(m) * 2 * k, g, 2.0f), dtype);
  const auto w = encode(randn(static_cast<size_t>(n) * k, g, 0.125f), dtype);
  const auto b = encode(randn(static_cast<size_t>(n), g), dtype);
  Device dgu(gate_up), dw(w), db(b), act(static_cast<size_t>(m) * k * 2), want(static_cast<size_t>(m) * n * 2),
      got(static_cast<size_t>(m) * n * 2);
  const rlx::cuda::GemvArgs a{
      .dtype = dtype, .x = act.p, .w = dw.p, .bias = bias ? db.p : nullptr, .out = want.p, .m = m, .n = n, .k = k};
  auto folded = a;
  folded.x = dgu.p;
  folded.out = got.p;
  folded.input = rlx::cuda::GemvInput::silu_mul;
  launch_ok(rlx::cuda::silu_mul(dtype, dgu.p, act.p, m, k, nullptr));
  launch_ok(kernel(a, nullptr));
  launch_ok(kernel(folded, nullptr));
  cuda_ok(cudaDeviceSynchronize());
  CHECK(got.get<uint8_t>() == want.get<uint8_t>());
  CHECK(dgu.get<uint8_t>() == gate_up);
}

// A projection kernel with the add + RMSNorm on the way in, against add_rms_norm (in place) and
// then the same kernel on its output, with the add and without: the same bytes; the residual it
// writes is add_rms_norm's, and x is not written.
void check_norm_fold(int (*kernel)(const rlx::cuda::GemvArgs&, void*), int m, int n, int k, bool bias, DType dtype,
                     std::mt19937& g) {
  const size_t mk = static_cast<size_t>(m) * k;
  const auto h = encode(randn(mk, g), dtype), add = encode(randn(mk, g), dtype);
  const auto weight = encode(randn(static_cast<size_t>(k), g, 0.5f), dtype);
  const auto w = encode(randn(static_cast<size_t>(n) * k, g, 0.125f), dtype);
  const auto b = encode(randn(static_cast<size_t>(n), g), dtype);
  Device dw(w), db(b), dweight(weight), dadd(add);
  for (bool with_add : {true, false}) {
    INFO("with add " << with_add);
    Device residual(h), normed(mk * 2), want(static_cast<size_t>(m) * n * 2);
    launch_ok(rlx::cuda::add_rms_norm({.dtype = dtype,
                                       .residual = residual.p,
                                       .x = with_add ? dadd.p : nullptr,
                                       .weight = dweight.p,
                                       .out = normed.p,
                                       .rows = m,
                                       .hidden = k},
                                      nullptr));
    const rlx::cuda::GemvArgs a{
        .dtype = dtype, .x = normed.p, .w = dw.p, .bias = bias ? db.p : nullptr, .out = want.p, .m = m, .n = n, .k = k};
    launch_ok(kernel(a, nullptr));
    Device x(h), sum(mk * 2), got(static_cast<size_t>(m) * n * 2);
    auto folded = a;
    folded.x = x.p;
    folded.out = got.p;
    folded.input = rlx::cuda::GemvInput::add_rms_norm;
    folded.add = with_add ? dadd.p : nullptr;
    folded.norm_weight = dweight.p;
    folded.residual_out = with_add ? sum.p : nullptr;
    launch_ok(kernel(folded, nullptr));
    cuda_ok(cudaDeviceSynchronize());
    CHECK(got.get<uint8_t>() == want.get<uint8_t>());
    CHECK(x.get<uint8_t>() == h);
    if (with_add) CHECK(sum.get<uint8_t>() == residual.get<uint8_t>());
  }
}

// A projection kernel taking the norm on the way in takes `ok` (x, w, out and norm_weight
// allocated for `rows` rows of `width`) and refuses: `width` grown past its limit or `rows`
// past its rows, an add with nowhere to write the sum, the sum written over x.
void check_norm_refusals(int (*kernel)(const rlx::cuda::GemvArgs&, void*), int rows, int width, bool wider) {
  Device x(static_cast<size_t>(rows) * (width + 64) * 2), w(static_cast<size_t>(64) * (width + 64) * 2),
      out(static_cast<size_t>(rows) * 64 * 2), weight(static_cast<size_t>(width + 64) * 2);
  const rlx::cuda::GemvArgs ok{.x = x.p,
                               .w = w.p,
                               .out = out.p,
                               .m = 1,
                               .n = 64,
                               .k = width,
                               .input = rlx::cuda::GemvInput::add_rms_norm,
                               .norm_weight = weight.p};
  launch_ok(kernel(ok, nullptr));
  auto too_big = ok, no_sum = ok, sum_over_x = ok;
  if (wider)
    too_big.k = width + 64;
  else
    too_big.m = rows;
  no_sum.add = w.p;
  sum_over_x.add = w.p;
  sum_over_x.residual_out = x.p;
  for (const auto& a : {too_big, no_sum, sum_over_x}) CHECK(kernel(a, nullptr) != 0);
}

}  // namespace

// The small-batch projection (decode at batch <= 8), by check_projection.
TEST_CASE("cuda kernels: the small-batch projection equals the reference, a row alone equals it among the rows", "[cuda]") {
  std::mt19937 g(9);
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int m : {1, 2, 3, 5, 8}) {
      // n past a multiple of the rows a block takes (partial row groups); k giving teams of
      // 16 (64, 128), 32 (896), 64 (2048), 128 (4864) and 256 threads, the last with chunks
      // past one batch (12296: 1537 chunks).
      for (auto [n, k, bias] :
           {std::tuple{17, 64, true}, std::tuple{1152, 896, true}, std::tuple{5001, 4864, false},
            std::tuple{20001, 128, false}, std::tuple{333, 2048, true}, std::tuple{300, 12296, true}}) {
        INFO(name(dtype) << " m " << m << " n " << n << " k " << k);
        check_projection(rlx::cuda::gemv, m, n, k, bias, m - 1, dtype, g);
      }
    }
  }
}

// The tensor-core projection for decode's larger batches (9 to 256 rows), by check_projection: m
// past a tile (8 rows) and past a block (64); n past a 16-row tile; k of 1, 14 and 76 chunks
// (Qwen2.5-0.5B's 896 and 4864).
TEST_CASE("cuda kernels: the tensor-core decode projection equals the reference, a row alone equals it among the rows",
          "[cuda]") {
  std::mt19937 g(17);
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int m : {9, 16, 33, 64, 100, 256}) {
      // n of 1, 2 and 4 w tiles a block (below 8192, to 16384, past).
      for (auto [n, k, bias] :
           {std::tuple{37, 64, true}, std::tuple{1152, 896, true}, std::tuple{900, 4864, false},
            std::tuple{4100, 896, false}, std::tuple{8200, 128, true}, std::tuple{16400, 64, false}}) {
        // The fp64 reference's cost bounded (the binary also runs under compute-sanitizer twice).
        if (static_cast<double>(m) * n * k > 3e8) continue;
        INFO(name(dtype) << " m " << m << " n " << n << " k " << k);
        check_projection(rlx::cuda::decode_gemm, m, n, k, bias, m - 1, dtype, g);  // the last row: a partial tile
      }
    }
  }
  Device x(64 * 2), w(64 * 2), out(64 * 2);
  CHECK(rlx::cuda::decode_gemm({.x = x.p, .w = w.p, .out = out.p, .m = 1, .n = 1, .k = 56}, nullptr) != 0);  // k % 64
  CHECK(rlx::cuda::decode_gemm({.x = x.p, .w = w.p, .out = out.p, .m = 257, .n = 1, .k = 64}, nullptr) != 0);
}

// The decode GEMM with SiLU-mul on the way in (the down projection at 9 to 256 rows): silu_mul,
// then the GEMM, bit for bit. m within a tile, past one x tile block of 4 tiles (the fold takes
// at most 4) and to 256; k of 1 and 76 chunks; n past a 16-row tile. A norm it refuses.
TEST_CASE("cuda kernels: the decode GEMM with the norm or SiLU-mul on the way in equals the kernels it replaces",
          "[cuda]") {
  std::mt19937 g(19);
  for (DType dtype : {DType::f16, DType::bf16}) {
    // x tiles a block: 1 (the GEMV's rows, with it off), 2, 4 (partly filled), 2 blocks, 8.
    for (int m : {3, 9, 17, 40, 256}) {
      // n of 1, 2 and 4 w tiles a block (to 8192, to 16384, past: the blocks of later columns
      // write no residual).
      for (auto [n, k, bias] : {std::tuple{896, 4864, false}, std::tuple{37, 64, true}, std::tuple{1100, 128, true},
                                std::tuple{8200, 64, false}, std::tuple{16400, 64, true}}) {
        if (n > 8192 && m != 17 && m != 256) continue;  // the wide cases at two batches (the sanitizers' time)
        INFO(name(dtype) << " silu m " << m << " n " << n << " k " << k);
        check_silu_fold(rlx::cuda::decode_gemm, m, n, k, bias, dtype, g);
      }
      // The norm kernel's threads 32, 128 and 256 with one vector a thread, and 2 (3584) and 4
      // (8192) vectors a thread.
      for (auto [n, k, bias] : {std::tuple{1152, 896, true}, std::tuple{37, 64, false}, std::tuple{500, 2048, true},
                                std::tuple{70, 3584, false}, std::tuple{40, 8192, true}, std::tuple{8200, 128, false},
                                std::tuple{16400, 64, true}}) {
        if (n > 8192 && m != 17 && m != 256) continue;
        INFO(name(dtype) << " norm m " << m << " n " << n << " k " << k);
        check_norm_fold(rlx::cuda::decode_gemm, m, n, k, bias, dtype, g);
      }
    }
  }
  // Refused: a norm wider than the norm kernel's vector path (8192), and the add's errors.
  check_norm_refusals(rlx::cuda::decode_gemm, 9, 8192, /*wider=*/true);
}

TEST_CASE("cuda kernels: the expert-indexed projection gives each row its own expert's product", "[cuda]") {
  std::mt19937 g(11);
  const int E = 8, top = 2;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (auto [tokens, n, k] : {std::tuple{1, 1536, 2048}, std::tuple{3, 64, 64}, std::tuple{5, 20001, 128}}) {
      INFO(name(dtype) << " tokens " << tokens << " n " << n << " k " << k);
      const int rows = tokens * top;
      auto x = rounded(randn(static_cast<size_t>(tokens) * k, g), dtype);
      auto w = rounded(randn(static_cast<size_t>(E) * n * k, g, 0.125f), dtype);
      std::vector<int64_t> experts(static_cast<size_t>(rows));
      for (int i = 0; i < rows; ++i) experts[static_cast<size_t>(i)] = (5 * i + 3) % E;  // two per token, distinct
      std::vector<float> want(static_cast<size_t>(rows) * n);
      double scale = 0;
      for (int i = 0; i < rows; ++i)
        for (int c = 0; c < n; ++c) {
          const float* wr = w.data() + (experts[static_cast<size_t>(i)] * n + c) * static_cast<int64_t>(k);
          const float* xr = x.data() + static_cast<int64_t>(i / top) * k;
          double s = 0;
          for (int j = 0; j < k; ++j) s += static_cast<double>(xr[j]) * wr[j];
          want[static_cast<size_t>(i) * n + c] = static_cast<float>(s);
          scale = std::max(scale, std::abs(s));
        }
      Device dx(encode(x, dtype)), dw(encode(w, dtype)), de(experts), out(static_cast<size_t>(rows) * n * 2);
      rlx::cuda::GemvArgs a{.dtype = dtype,
                            .x = dx.p,
                            .w = dw.p,
                            .out = out.p,
                            .m = rows,
                            .n = n,
                            .k = k,
                            .experts = de.as<int64_t>(),
                            .x_share = top};
      launch_ok(rlx::cuda::gemv(a, nullptr));
      cuda_ok(cudaDeviceSynchronize());
      CHECK(max_abs_diff(decode(out.get<uint8_t>(), dtype), want) <=
            (dtype == DType::bf16 ? 8e-3 : 1e-3) * std::max(scale, 1.0));
    }
  }
}

// The GEMV with the layer op before it taken on the way in (decode at small batch, RLX_GEMV=1):
// its product is the separate kernels' (add_rms_norm or silu_mul, then the GEMV), bit for bit,
// and the residual it writes is add_rms_norm's. Widths give the norm kernel's threads 32, 128
// and 256 with one vector a thread, and 2 (3584, Qwen2.5-7B) and 4 (8192) vectors a thread.
TEST_CASE("cuda kernels: the GEMV with the norm or SiLU-mul on the way in equals the kernels it replaces", "[cuda]") {
  std::mt19937 g(13);
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int m : {1, 3, 8}) {
      for (auto [n, k] :
           {std::pair{1152, 896}, std::pair{37, 64}, std::pair{500, 2048}, std::pair{70, 3584}, std::pair{40, 8192},
            std::pair{8200, 896}}) {                          // the last: more groups of rows than the grid's blocks
        if (m * k * 2 > rlx::cuda::kGemvNormBytes) continue;  // refused (checked below)
        INFO(name(dtype) << " norm m " << m << " n " << n << " k " << k);
        check_norm_fold(rlx::cuda::gemv, m, n, k, /*bias=*/true, dtype, g);
      }
      // Staged in shared memory where m k 2 bytes fit in kGemvNormBytes, else from gate and up
      // as the products need them (20488 at one row: past it; 1100 rows: more groups of rows
      // than the grid's blocks).
      for (auto [n, k] : {std::pair{896, 4864}, std::pair{37, 64}, std::pair{300, 12296}, std::pair{1100, 20488}}) {
        INFO(name(dtype) << " silu m " << m << " n " << n << " k " << k);
        check_silu_fold(rlx::cuda::gemv, m, n, k, /*bias=*/n == 37, dtype, g);
      }
    }
  }
  // Refused: 8 rows of 4096 (64 KiB, past the shared memory), and the add's errors.
  check_norm_refusals(rlx::cuda::gemv, 8, 4096, /*wider=*/false);
}
