#include "rlx/rollout/engine.hpp"

#include <c10/core/GradMode.h>
#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "../helpers.hpp"
#include "rlx/core/rng.hpp"

using Catch::Matchers::Contains;
using rlx::Engine;
using rlx::EngineConfig;
using rlx::FinishReason;
using rlx::GenerationRequest;
using rlx::GenerationResult;
using rlx::SamplingParams;
using rlx::TokenId;
using rlx::test::error_of;

namespace {

std::shared_ptr<rlx::Transformer> make_model(uint64_t seed, int64_t vocab = 512,
                                             std::string_view preset = "tiny", rlx::Arch arch = rlx::Arch::qwen2) {
  auto c = rlx::model_preset(preset, arch);
  c.vocab_size = vocab;
  // Wider weights than HF's init: peaked logits, so greedy choices are not near-ties.
  c.initializer_range = 0.08;
  auto m = std::make_shared<rlx::Transformer>(c);
  m->init_weights(seed);
  return m;
}

std::vector<TokenId> random_prompt(uint64_t seed, int64_t len, int64_t vocab = 512) {
  rlx::RngStream rng(seed, 99);
  std::vector<TokenId> out;
  for (int64_t i = 0; i < len; ++i) out.push_back(static_cast<TokenId>(rng.uniform_int(0, vocab - 1)));
  return out;
}

at::Tensor ids_tensor(const std::vector<TokenId>& ids) {
  return at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
}

// Greedy decoding with the full forward (no cache): the reference.
std::vector<TokenId> greedy_reference(rlx::Transformer& m, std::vector<TokenId> tokens, int64_t new_tokens) {
  c10::NoGradGuard g;
  std::vector<TokenId> out;
  for (int64_t i = 0; i < new_tokens; ++i) {
    auto logits = m.forward({.tokens = ids_tensor(tokens)})[0][-1];
    out.push_back(static_cast<TokenId>(logits.argmax().item<int64_t>()));
    tokens.push_back(out.back());
  }
  return out;
}

// log_softmax(logits / T) of each generated token under the full forward.
std::vector<float> full_logprobs(rlx::Transformer& m, const std::vector<TokenId>& prompt,
                                 const std::vector<TokenId>& gen, double temperature) {
  c10::NoGradGuard g;
  auto all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  auto logp = at::log_softmax(m.forward({.tokens = ids_tensor(all)})[0] / temperature, -1);
  std::vector<float> out;
  for (size_t i = 0; i < gen.size(); ++i)
    out.push_back(logp[static_cast<int64_t>(prompt.size() + i) - 1][gen[i]].item<float>());
  return out;
}

// The tolerance between two fp32 computations of the same log-probs that differ only in how
// rows are batched: BLAS blocking and the vector width ATen picks for the CPU
// (ATEN_CPU_CAPABILITY) change the order of each sum. A logit of this model sums at most 176
// products of O(1) terms per layer through 2 layers, so two orders differ by at most a few
// hundred ulps of fp32 (eps 1.19e-7) of it; a log-prob (|lp| < 10 here) inherits that. A wrong
// token, position or cache block moves a log-prob by 1e-2 or more. Measured: 1.4e-6 between
// the plain and overlapped engines on an AVX-512 machine, 0 on others.
constexpr double kLogprobTol = 512 * static_cast<double>(std::numeric_limits<float>::epsilon());  // 6.1e-5

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

struct Setup {
  const char* name;
  EngineConfig cfg;
};

const std::vector<Setup>& setups() {
  static const std::vector<Setup> s = {
      {"default", {}},
      {"chunked prefill", {.max_batch_tokens = 7}},
      {"tiny cache (preemption)", {.block_size = 4, .kv_cache_blocks = 24}},
      {"no prefix caching, block 1", {.block_size = 1, .kv_cache_blocks = 4096, .prefix_caching = false}},
  };
  return s;
}

std::vector<GenerationRequest> mixed_requests(SamplingParams p, int64_t n_per = 1) {
  // Mixed lengths, a shared 20-token prefix on some, and groups of n_per samples.
  std::vector<GenerationRequest> reqs;
  const auto common = random_prompt(1000, 20);
  const int64_t lengths[] = {3, 17, 33, 8, 1, 40};
  for (int i = 0; i < 6; ++i) {
    auto prompt = random_prompt(static_cast<uint64_t>(i), lengths[i]);
    if (i % 2 == 0) prompt.insert(prompt.begin(), common.begin(), common.end());
    p.n = n_per;
    reqs.push_back({.id = "r" + std::to_string(i), .prompt = prompt, .params = p, .seed = 5});
  }
  return reqs;
}

}  // namespace

TEST_CASE("engine: greedy output equals greedy full-forward decoding, token for token", "[rollout][engine][numerics]") {
  auto model = make_model(1);
  for (const auto& setup : setups()) {
    for (int64_t n : {1, 3}) {
      INFO(setup.name << ", n = " << n);
      Engine engine(model, setup.cfg);
      auto reqs = mixed_requests({.temperature = 0, .max_new_tokens = 20}, n);
      auto results = engine.generate(reqs);
      REQUIRE(results.size() == reqs.size());
      for (size_t i = 0; i < reqs.size(); ++i) {
        auto expect = greedy_reference(*model, reqs[i].prompt, 20);
        REQUIRE(results[i].samples.size() == static_cast<size_t>(n));
        for (const auto& s : results[i].samples) {
          CHECK(s.tokens == expect);
          CHECK(s.finish == FinishReason::length);
          CHECK(max_diff(s.logprobs, full_logprobs(*model, reqs[i].prompt, s.tokens, 1.0)) <= kLogprobTol);
        }
      }
      const auto st = engine.stats();
      if (std::string(setup.name).starts_with("tiny")) CHECK(st.preemptions > 0);
      if (n > 1) CHECK(st.shared_prefill_tokens > 0);
      if (setup.cfg.prefix_caching && setup.cfg.block_size > 1) CHECK(st.prefix_hit_tokens > 0);
      CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
    }
  }
}

TEST_CASE("engine: sampled log-probs equal the full forward's log_softmax(logits / T) within rounding", "[rollout][engine][numerics]") {
  auto model = make_model(2);
  for (const auto& setup : setups()) {
    INFO(setup.name);
    Engine engine(model, setup.cfg);
    auto reqs = mixed_requests({.temperature = 0.8, .top_k = 40, .top_p = 0.9, .max_new_tokens = 24}, 4);
    auto results = engine.generate(reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      for (const auto& s : results[i].samples) {
        REQUIRE(s.tokens.size() == 24);
        CHECK(max_diff(s.logprobs, full_logprobs(*model, reqs[i].prompt, s.tokens, 0.8)) <= kLogprobTol);
      }
    // The 4 samples of a group are different draws, not copies.
    CHECK(results[0].samples[0].tokens != results[0].samples[1].tokens);
  }
}

TEST_CASE("engine: log-prob alternatives and prompt log-probs are the full forward's, and change no token", "[rollout][engine][numerics]") {
  auto model = make_model(3);
  for (const auto& setup : setups()) {
    for (double T : {0.0, 0.7}) {
      INFO(setup.name << ", T = " << T);
      const SamplingParams plain{.temperature = T, .max_new_tokens = 12};
      Engine ref_engine(model, setup.cfg);
      const auto ref = ref_engine.generate(mixed_requests(plain, 2));
      SamplingParams asked = plain;
      asked.logprobs = 5;
      asked.prompt_logprobs = 3;
      Engine engine(model, setup.cfg);
      const auto reqs = mixed_requests(asked, 2);
      // Twice: the second time the prefix cache holds every prompt, which must be computed again.
      for (int round = 0; round < 2; ++round) {
        INFO("round " << round);
        const auto results = engine.generate(reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
          const auto& prompt = reqs[i].prompt;
          CHECK(ref[i].prompt_logprobs.empty());
          CHECK(ref[i].samples[0].top_logprobs.empty());
          for (size_t j = 0; j < results[i].samples.size(); ++j) {
            const auto& s = results[i].samples[j];
            CHECK(s.tokens == ref[i].samples[j].tokens);  // asking changes nothing sampled
            CHECK(max_diff(s.logprobs, ref[i].samples[j].logprobs) <= kLogprobTol);
            auto all = prompt;
            all.insert(all.end(), s.tokens.begin(), s.tokens.end());
            c10::NoGradGuard g;
            const auto logp = at::log_softmax(model->forward({.tokens = ids_tensor(all)})[0] / (T > 0 ? T : 1.0), -1);
            REQUIRE(s.top_logprobs.size() == s.tokens.size());
            for (size_t t = 0; t < s.tokens.size(); ++t) {
              const auto row = logp[static_cast<int64_t>(prompt.size() + t) - 1];
              const auto best = std::get<0>(row.topk(5));
              const auto& top = s.top_logprobs[t];
              REQUIRE(top.size() == 5);
              for (size_t a = 0; a < 5; ++a) {
                if (a > 0) CHECK(top[a].logprob <= top[a - 1].logprob);
                CHECK(std::abs(top[a].logprob - best[static_cast<int64_t>(a)].item<float>()) <= kLogprobTol);
                CHECK(std::abs(top[a].logprob - row[top[a].token].item<float>()) <= kLogprobTol);
              }
              if (T == 0) CHECK((top[0].token == s.tokens[t] && top[0].logprob == s.logprobs[t]));  // exactly the recorded one
              CHECK(s.logprobs[t] <= top[0].logprob + kLogprobTol);
            }
            if (j > 0) continue;
            // Prompt token p + 1 given tokens 0..p.
            const auto& plp = results[i].prompt_logprobs;
            REQUIRE(plp.size() == prompt.size() - 1);
            REQUIRE(results[i].prompt_top_logprobs.size() == prompt.size() - 1);
            double worst = 0;
            for (size_t p = 0; p + 1 < prompt.size(); ++p) {
              const auto row = logp[static_cast<int64_t>(p)];
              worst = std::max(worst, std::abs(static_cast<double>(plp[p]) - row[prompt[p + 1]].item<float>()));
              const auto& top = results[i].prompt_top_logprobs[p];
              REQUIRE(top.size() == 3);
              CHECK(std::abs(top[0].logprob - row.max().item<float>()) <= kLogprobTol);
            }
            CHECK(worst <= kLogprobTol);
          }
        }
      }
      CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
    }
  }
}

TEST_CASE("engine: log-prob counts out of range are rejected, naming the field", "[rollout][engine]") {
  auto model = make_model(3);
  Engine engine(model);
  SamplingParams p{.max_new_tokens = 4};
  p.logprobs = 21;
  CHECK_THROWS_WITH(engine.add({.id = "a", .prompt = {1, 2}, .params = p}), Contains("logprobs is 21"));
  p.logprobs = 0;
  p.prompt_logprobs = -2;
  CHECK_THROWS_WITH(engine.add({.id = "b", .prompt = {1, 2}, .params = p}), Contains("prompt_logprobs is -2"));
}

TEST_CASE("engine: the same seed gives the same tokens whatever the batch, its order and the cache", "[rollout][engine][numerics]") {
  auto model = make_model(3);
  GenerationRequest target{.id = "target", .prompt = random_prompt(77, 12), .params = {.max_new_tokens = 30, .n = 2}, .seed = 9};
  Engine alone(model);
  auto a = alone.generate({target})[0];
  auto others = mixed_requests({.temperature = 1.2, .max_new_tokens = 25}, 2);
  for (const auto& setup : setups()) {
    for (bool target_first : {true, false}) {
      INFO(setup.name << (target_first ? ", target first" : ", target last"));
      Engine engine(model, setup.cfg);
      auto reqs = others;
      if (target_first) reqs.insert(reqs.begin(), target);
      else reqs.push_back(target);
      auto results = engine.generate(reqs);
      const auto& b = target_first ? results.front() : results.back();
      REQUIRE(b.samples.size() == 2);
      CHECK(b.samples[0].tokens == a.samples[0].tokens);
      CHECK(b.samples[1].tokens == a.samples[1].tokens);
      CHECK(max_diff(b.samples[0].logprobs, a.samples[0].logprobs) <= kLogprobTol);
    }
  }
  // A different seed draws differently.
  auto t2 = target;
  t2.seed = 10;
  CHECK(alone.generate({t2})[0].samples[0].tokens != a.samples[0].tokens);
}

TEST_CASE("engine: generate with a cancel flag aborts what is still running", "[rollout][engine]") {
  auto model = make_model(4);
  Engine engine(model, {.block_size = 16, .kv_cache_blocks = 1200});
  std::atomic<bool> cancel{false};
  auto all_aborted = [&](const std::vector<GenerationResult>& out, size_t max_tokens) {
    REQUIRE(out.size() == 6);
    for (const auto& r : out)
      for (const auto& s : r.samples) {
        CHECK(s.finish == FinishReason::abort);
        CHECK(s.tokens.size() < max_tokens);
      }
    CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
    CHECK_FALSE(engine.has_work());
  };
  SECTION("not raised: every request runs to its length") {
    for (const auto& r : engine.generate(mixed_requests({.temperature = 1.0, .max_new_tokens = 12}, 2), &cancel))
      for (const auto& s : r.samples) CHECK(s.finish == FinishReason::length);
  }
  SECTION("raised before: nothing is generated") {
    cancel = true;
    all_aborted(engine.generate(mixed_requests({.temperature = 1.0, .max_new_tokens = 50}, 2), &cancel), 2);
  }
  SECTION("raised from another thread mid-way: everything ends early, the blocks come back") {
    std::thread raiser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      cancel = true;
    });
    auto out = engine.generate(mixed_requests({.temperature = 1.0, .max_new_tokens = 1500}, 2), &cancel);
    raiser.join();
    all_aborted(out, 1500);
  }
}

TEST_CASE("engine: after finished, aborted and preempted requests every block is free", "[rollout][engine]") {
  auto model = make_model(4);
  Engine engine(model, {.block_size = 4, .kv_cache_blocks = 40, .max_batch_tokens = 64});
  auto reqs = mixed_requests({.temperature = 1.0, .max_new_tokens = 30}, 3);
  reqs[1].params.stop_token_ids = {7, 8, 9, 10, 11, 12};
  for (auto& r : reqs) engine.add(r);
  std::vector<GenerationResult> done;
  for (int i = 0; i < 6; ++i)
    for (auto& r : engine.step()) done.push_back(std::move(r));
  CHECK(engine.abort("r2"));
  CHECK(engine.abort("r5"));
  CHECK_FALSE(engine.abort("nope"));
  for (auto& r : engine.run()) done.push_back(std::move(r));
  REQUIRE(done.size() == reqs.size());
  int aborted = 0;
  for (const auto& r : done)
    for (const auto& s : r.samples) aborted += s.finish == FinishReason::abort;
  CHECK(aborted == 6);
  CHECK(engine.stats().preemptions > 0);
  CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
  for (rlx::BlockId b = 0; b < engine.blocks().num_blocks(); ++b) CHECK(engine.blocks().ref_count(b) == 0);
  CHECK_FALSE(engine.has_work());
  CHECK(engine.stats().running == 0);
  CHECK(engine.stats().waiting == 0);
}

TEST_CASE("engine: a weight update mid-flight is applied atomically and recorded per token", "[rollout][engine][numerics]") {
  auto model_a = make_model(5), model_b = make_model(6);
  auto engine_model = make_model(5);
  std::vector<std::pair<std::string, at::Tensor>> weights_b;
  for (auto& [name, p] : model_b->hf_parameters()) weights_b.emplace_back(name, p);
  auto prompt = random_prompt(3, 10);
  SamplingParams params{.temperature = 1.0, .max_new_tokens = 30, .n = 2};

  SECTION("continue: partial rollout, later tokens on the new weights with exact log-probs") {
    Engine engine(engine_model, {.update_policy = rlx::UpdatePolicy::continue_});
    engine.add({.id = "a", .prompt = prompt, .params = params});
    for (int i = 0; i < 8; ++i) REQUIRE(engine.step().empty());
    engine.update_weights(1, weights_b);
    CHECK(engine.weight_version() == 0);  // staged, not applied until the next step
    auto r = engine.run().at(0);
    CHECK(engine.weight_version() == 1);
    CHECK(r.version_range() == std::pair<int64_t, int64_t>{0, 1});
    for (const auto& s : r.samples) {
      REQUIRE(s.tokens.size() == 30);
      const auto first_new = std::find(s.versions.begin(), s.versions.end(), 1) - s.versions.begin();
      CHECK(first_new == 8);
      CHECK(std::all_of(s.versions.begin() + first_new, s.versions.end(), [](int64_t v) { return v == 1; }));
      // Each token's log-prob is that of the weights that sampled it.
      auto lp_a = full_logprobs(*model_a, prompt, s.tokens, 1.0), lp_b = full_logprobs(*model_b, prompt, s.tokens, 1.0);
      for (size_t t = 0; t < s.tokens.size(); ++t)
        CHECK(std::abs(s.logprobs[t] - (s.versions[t] == 0 ? lp_a[t] : lp_b[t])) <= kLogprobTol);
    }
  }
  SECTION("finish_old: in-flight requests finish on the old weights, new ones wait for the new") {
    Engine engine(engine_model, {.update_policy = rlx::UpdatePolicy::finish_old});
    engine.add({.id = "old", .prompt = prompt, .params = params});
    for (int i = 0; i < 5; ++i) engine.step();
    engine.update_weights(1, weights_b);
    engine.add({.id = "new", .prompt = prompt, .params = params});
    auto results = engine.run();
    REQUIRE(results.size() == 2);
    for (const auto& r : results) {
      INFO(r.id);
      const int64_t v = r.id == "old" ? 0 : 1;
      CHECK(r.version_range() == std::pair<int64_t, int64_t>{v, v});
      auto& m = v == 0 ? *model_a : *model_b;
      for (const auto& s : r.samples) CHECK(max_diff(s.logprobs, full_logprobs(m, prompt, s.tokens, 1.0)) <= kLogprobTol);
    }
  }
  SECTION("abort: in-flight requests end at once") {
    Engine engine(engine_model, {.update_policy = rlx::UpdatePolicy::abort});
    engine.add({.id = "a", .prompt = prompt, .params = params});
    for (int i = 0; i < 5; ++i) engine.step();
    engine.update_weights(1, weights_b);
    auto r = engine.step().at(0);
    for (const auto& s : r.samples) {
      CHECK(s.finish == FinishReason::abort);
      CHECK(s.tokens.size() == 5);
    }
    CHECK(engine.weight_version() == 1);
    CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
  }
  SECTION("bad updates are rejected whole, naming the tensor; nothing is applied") {
    Engine engine(engine_model);
    auto bad = weights_b;
    bad[3].second = at::zeros({2, 2});
    CHECK_THAT(error_of([&] { engine.update_weights(1, bad); }), Contains(bad[3].first) && Contains("shape [2, 2]"));
    auto missing = weights_b;
    missing.pop_back();
    CHECK_THAT(error_of([&] { engine.update_weights(1, missing); }), Contains("is missing"));
    auto extra = weights_b;
    extra.emplace_back("model.layers.9.mlp.up_proj.weight", at::zeros({1}));
    CHECK_THAT(error_of([&] { engine.update_weights(1, extra); }), Contains("not a parameter"));
    engine.update_weights(2, weights_b);
    CHECK_THAT(error_of([&] { engine.update_weights(2, weights_b); }), Contains("versions must increase"));
    auto r = engine.generate({{.id = "x", .prompt = prompt, .params = {.temperature = 0, .max_new_tokens = 6}}})[0];
    CHECK(r.version_range() == std::pair<int64_t, int64_t>{2, 2});
    CHECK(r.samples[0].tokens == greedy_reference(*model_b, prompt, 6));
  }
}

TEST_CASE("engine: bad requests are rejected naming the request and the field, others are unaffected", "[rollout][engine]") {
  auto model = make_model(7);
  Engine engine(model, {.max_model_len = 64});
  const auto prompt = random_prompt(1, 5);
  engine.add({.id = "good", .prompt = prompt, .params = {.temperature = 0, .max_new_tokens = 12}});
  engine.step();
  auto err = [&](GenerationRequest r) { return error_of([&] { engine.add(std::move(r)); }); };
  CHECK_THAT(err({.id = "e1", .prompt = {}}), Contains("request 'e1'") && Contains("prompt is empty"));
  CHECK_THAT(err({.id = "e2", .prompt = random_prompt(2, 64)}), Contains("request 'e2'") && Contains("prompt has 64 tokens"));
  CHECK_THAT(err({.id = "e3", .prompt = prompt, .params = {.max_new_tokens = 0}}), Contains("request 'e3'") && Contains("max_new_tokens"));
  CHECK_THAT(err({.id = "e4", .prompt = prompt, .params = {.max_new_tokens = -5}}), Contains("max_new_tokens = -5"));
  CHECK_THAT(err({.id = "e5", .prompt = prompt, .params = {.top_p = 1.5}}), Contains("request 'e5'") && Contains("top_p = 1.5"));
  CHECK_THAT(err({.id = "e6", .prompt = prompt, .params = {.stop_strings = {"x"}}}), Contains("request 'e6'") && Contains("tokenizer"));
  CHECK_THAT(err({.id = "good", .prompt = prompt}), Contains("request 'good'") && Contains("duplicate request id"));
  CHECK_THAT(err({.id = "e7", .prompt = {1, 512}}), Contains("prompt[1] = 512"));
  CHECK_THAT(err({.id = "", .prompt = prompt}), Contains("request id"));
  auto results = engine.run();
  REQUIRE(results.size() == 1);
  CHECK(results[0].samples[0].tokens == greedy_reference(*model, prompt, 12));
  // The id is free again once its request is returned.
  engine.add({.id = "good", .prompt = prompt, .params = {.max_new_tokens = 2}});
  CHECK(engine.run().size() == 1);
}

TEST_CASE("engine: a cache too small for a request is an error at add, not a hang", "[rollout][engine]") {
  auto model = make_model(7);
  Engine engine(model, {.block_size = 4, .kv_cache_blocks = 4});
  CHECK_THAT(error_of([&] { engine.add({.id = "big", .prompt = random_prompt(1, 10), .params = {.max_new_tokens = 10}}); }),
             Contains("request 'big'") && Contains("5 KV blocks"));
}

TEST_CASE("engine: context length ends a sample with reason length", "[rollout][engine]") {
  auto model = make_model(8);
  Engine engine(model, {.max_model_len = 20});
  auto r = engine.generate({{.id = "a", .prompt = random_prompt(1, 15), .params = {.max_new_tokens = 100}}})[0];
  CHECK(r.samples[0].tokens.size() == 5);
  CHECK(r.samples[0].finish == FinishReason::length);
}

TEST_CASE("engine: stop token ids and stop strings end a sample with the completing token", "[rollout][engine]") {
  auto tok = std::make_shared<rlx::CharTokenizer>(rlx::default_char_alphabet());
  auto model = make_model(9, tok->vocab_size());
  Engine engine(model, {}, tok);
  const auto prompt = tok->encode("12+34=");
  auto ref = greedy_reference(*model, prompt, 40);
  const std::string text = tok->decode(ref);
  // A stop string taken from the middle of the greedy text; the sample ends with the token
  // that first completes it.
  const std::string stop = text.substr(10, 3);
  size_t k = 1;
  while (tok->decode(std::span<const TokenId>(ref).first(k)).find(stop) == std::string::npos) ++k;
  auto r = engine.generate({{.id = "s",
                             .prompt = prompt,
                             .params = {.temperature = 0, .max_new_tokens = 40, .stop_strings = {"\x01never", stop}, .ignore_eos = true}}})[0];
  CHECK(r.samples[0].tokens == std::vector<TokenId>(ref.begin(), ref.begin() + static_cast<int64_t>(k)));
  CHECK(r.samples[0].finish == FinishReason::stop);
  CHECK(r.samples[0].stop_string == stop);

  const TokenId stop_id = ref[6];
  const auto first = std::find(ref.begin(), ref.end(), stop_id) - ref.begin();
  r = engine.generate({{.id = "t", .prompt = prompt, .params = {.temperature = 0, .max_new_tokens = 40, .stop_token_ids = {stop_id}, .ignore_eos = true}}})[0];
  CHECK(r.samples[0].tokens == std::vector<TokenId>(ref.begin(), ref.begin() + first + 1));
  CHECK(r.samples[0].finish == FinishReason::stop);
}

TEST_CASE("engine: abort returns partial samples, pause stops progress until resume", "[rollout][engine]") {
  auto model = make_model(10);
  Engine engine(model);
  engine.add({.id = "a", .prompt = random_prompt(1, 6), .params = {.max_new_tokens = 50, .n = 2}});
  engine.add({.id = "b", .prompt = random_prompt(2, 6), .params = {.max_new_tokens = 20}});
  for (int i = 0; i < 4; ++i) REQUIRE(engine.step().empty());
  engine.abort("a");
  auto out = engine.step();
  REQUIRE(out.size() == 1);
  CHECK(out[0].id == "a");
  for (const auto& s : out[0].samples) {
    CHECK(s.finish == FinishReason::abort);
    CHECK(s.tokens.size() == 4);
    CHECK(s.logprobs.size() == 4);
  }
  engine.pause();
  const auto before = engine.stats().generated_tokens;
  for (int i = 0; i < 3; ++i) CHECK(engine.step().empty());
  CHECK(engine.stats().generated_tokens == before);
  CHECK(engine.run().empty());  // run() returns while paused
  engine.resume();
  auto rest = engine.run();
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].samples[0].tokens.size() == 20);
}

TEST_CASE("engine: requests added from another thread while stepping all complete", "[rollout][engine]") {
  auto model = make_model(11);
  Engine engine(model, {.max_running = 4});
  std::atomic<int> added{0};
  std::thread producer([&] {
    for (int i = 0; i < 16; ++i) {
      engine.add({.id = "t" + std::to_string(i), .prompt = random_prompt(static_cast<uint64_t>(i), 4 + i),
                  .params = {.max_new_tokens = 8 + i}});
      added.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::map<std::string, GenerationResult> done;
  while (done.size() < 16) {
    for (auto& r : engine.step()) done.emplace(r.id, std::move(r));
    if (!engine.has_work()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  producer.join();
  for (int i = 0; i < 16; ++i) CHECK(done.at("t" + std::to_string(i)).samples[0].tokens.size() == static_cast<size_t>(8 + i));
  CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
}

// Issue 33 item 6: decode step k+1 is launched before step k's tokens are appended. Rows
// whose sequence stops at k (stop tokens here) are computed and thrown away; the tokens,
// log-probs and finish reasons equal the unpipelined engine's, and every block comes back.
TEST_CASE("engine: overlapped decode steps give the unpipelined tokens, stopped rows are discarded", "[rollout][engine][numerics]") {
  auto model = make_model(12);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p{.temperature = i % 2 ? 1.1 : 0.0, .max_new_tokens = 12 + 5 * i, .n = i % 3 == 0 ? 2 : 1};
    // Common tokens of this vocabulary as stops, so samples end mid-chain at different steps.
    for (TokenId t = 0; t < 512; t += 9) p.stop_token_ids.push_back(t + i % 3);
    reqs.push_back({.id = "r" + std::to_string(i), .prompt = random_prompt(40 + static_cast<uint64_t>(i), 5 + 3 * i),
                    .params = p, .seed = 17});
  }
  reqs.push_back({.id = "shared", .prompt = reqs[0].prompt, .params = {.max_new_tokens = 20, .n = 3}, .seed = 5});
  for (const bool small_cache : {false, true}) {
    INFO((small_cache ? "a cache that preempts" : "a roomy cache"));
    EngineConfig base{.block_size = 4, .kv_cache_blocks = small_cache ? 40 : 0, .max_running = small_cache ? 5 : 16};
    EngineConfig plain = base, piped = base;
    plain.overlap = false;
    piped.overlap = true;
    Engine a(model, plain), b(model, piped);
    const auto ra = a.generate(reqs), rb = b.generate(reqs);
    REQUIRE(ra.size() == rb.size());
    int stopped = 0;
    for (size_t i = 0; i < ra.size(); ++i) {
      INFO(ra[i].id);
      REQUIRE(ra[i].samples.size() == rb[i].samples.size());
      for (size_t j = 0; j < ra[i].samples.size(); ++j) {
        CHECK(ra[i].samples[j].tokens == rb[i].samples[j].tokens);
        CHECK(max_diff(ra[i].samples[j].logprobs, rb[i].samples[j].logprobs) <= kLogprobTol);
        CHECK(ra[i].samples[j].finish == rb[i].samples[j].finish);
        stopped += rb[i].samples[j].finish == FinishReason::stop;
      }
    }
    CHECK(stopped >= 3);
    CHECK(a.stats().overlapped_steps == 0);
    CHECK(b.stats().overlapped_steps > 0);
    CHECK(b.stats().discarded_rows > 0);
    // Every row of a step is either appended or discarded: the pipelined engine computed
    // the same tokens plus its discarded rows.
    CHECK(b.stats().forward_tokens == a.stats().forward_tokens + b.stats().discarded_rows);
    CHECK(b.blocks().num_free() == b.blocks().num_blocks());
    CHECK_FALSE(b.has_work());
  }
}

TEST_CASE("engine: qwen3, mistral and mixture-of-experts models decode as their full forward does", "[rollout][engine][moe]") {
  const std::pair<const char*, rlx::Arch> models[] = {{"tiny", rlx::Arch::qwen3},
                                                      {"tiny", rlx::Arch::mistral},
                                                      {"tiny-moe", rlx::Arch::qwen3_moe},
                                                      {"tiny-moe", rlx::Arch::mixtral}};
  for (const auto& [preset, arch] : models) {
    auto model = make_model(3, 512, preset, arch);
    for (const auto& setup : setups()) {
      INFO(rlx::config::enum_to_string(arch) << ", " << setup.name);
      Engine engine(model, setup.cfg);
      auto reqs = mixed_requests({.temperature = 0, .max_new_tokens = 12}, 2);
      auto results = engine.generate(reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        auto expect = greedy_reference(*model, reqs[i].prompt, 12);
        for (const auto& s : results[i].samples) {
          CHECK(s.tokens == expect);
          CHECK(max_diff(s.logprobs, full_logprobs(*model, reqs[i].prompt, s.tokens, 1.0)) <= kLogprobTol);
        }
      }
      CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
    }
  }
}

namespace {
std::shared_ptr<rlx::Transformer> make_moe_model(uint64_t seed) {
  auto c = rlx::model_preset("tiny-moe");  // 8 experts, top 2, both layers sparse
  c.initializer_range = 0.08;
  auto m = std::make_shared<rlx::Transformer>(c);
  m->init_weights(seed);
  return m;
}

// A sample's recorded routing against the full forward's over its tokens, per (token,
// sparse layer) row as a set of experts: rows equal, rows recorded as none (-1).
struct RoutingMatch {
  int64_t rows = 0, equal = 0, none = 0;
  bool last_none = false;  // the last token (never forwarded) recorded as none
};
RoutingMatch match_routing(rlx::Transformer& m, const GenerationResult& r, size_t sample) {
  const auto& s = r.samples[sample];
  std::vector<TokenId> all = r.prompt;
  all.insert(all.end(), s.tokens.begin(), s.tokens.end());
  const auto L = static_cast<int64_t>(all.size()), S = static_cast<int64_t>(r.routing_layers), k = static_cast<int64_t>(r.routing_top_k);
  std::vector<int16_t> got = r.prompt_routing;
  got.insert(got.end(), s.routing.begin(), s.routing.end());
  REQUIRE(static_cast<int64_t>(got.size()) == L * S * k);
  c10::NoGradGuard g;
  rlx::RoutingTrace trace;
  m.forward({.tokens = ids_tensor(all), .trace = &trace});
  const auto ref = std::get<0>(at::sort(trace.routing()[0], -1));  // [L, S, k]
  const auto rec = at::from_blob(got.data(), {L, S, k}, at::kShort).to(at::kLong);
  RoutingMatch out;
  out.last_none = (rec[L - 1] < 0).all().item<bool>();
  const auto head = std::get<0>(at::sort(rec.narrow(0, 0, L - 1), -1));
  out.rows = (L - 1) * S;
  out.none = (head < 0).any(-1).sum().item<int64_t>();
  out.equal = (head == ref.narrow(0, 0, L - 1)).all(-1).sum().item<int64_t>();
  return out;
}
}  // namespace

TEST_CASE("engine: a mixture-of-experts model's routing is recorded for every forwarded token, as the full forward routes",
          "[rollout][engine][routing]") {
  auto model = make_moe_model(21);
  const auto& mc = model->config();
  REQUIRE(mc.sparse_layers().size() == 2);
  for (const auto& setup : setups()) {
    for (const bool overlap : {false, true}) {
      INFO(setup.name << (overlap ? ", overlapped decode" : ""));
      auto cfg = setup.cfg;
      cfg.overlap = overlap;
      Engine engine(model, cfg);
      // Twice: the second round's prompts come from the prefix cache where it is on.
      for (int round = 0; round < 2; ++round) {
        const auto results = engine.generate(mixed_requests({.temperature = 1.0, .max_new_tokens = 9}, /*n_per=*/3));
        for (const auto& r : results) {
          INFO(r.id << " round " << round);
          CHECK(r.routing_layers == 2);
          CHECK(r.routing_top_k == 2);
          for (size_t j = 0; j < r.samples.size(); ++j) {
            CHECK(r.samples[j].routing.size() == r.samples[j].tokens.size() * 4);
            const auto m = match_routing(*model, r, j);
            CHECK(m.none == 0);
            CHECK(m.equal == m.rows);
            CHECK(m.last_none);
          }
        }
      }
      if (cfg.prefix_caching && cfg.block_size > 1) CHECK(engine.stats().prefix_hit_tokens > 0);
      if (cfg.kv_cache_blocks == 24) CHECK(engine.stats().preemptions > 0);
      CHECK(engine.blocks().num_free() == engine.blocks().num_blocks());
    }
  }
}

TEST_CASE("engine: a dense model, or record_routing off, records no routing", "[rollout][engine][routing]") {
  const auto req = [] { return GenerationRequest{.id = "q", .prompt = random_prompt(3, 10), .params = {.max_new_tokens = 4, .n = 2}}; };
  Engine dense(make_model(4));
  auto r = dense.generate({req()});
  CHECK(r[0].routing_layers == 0);
  CHECK(r[0].prompt_routing.empty());
  CHECK(r[0].samples[1].routing.empty());
  Engine off(make_moe_model(4), {.record_routing = false});
  r = off.generate({req()});
  CHECK(r[0].routing_layers == 0);
  CHECK(r[0].prompt_routing.empty());
  CHECK(r[0].samples[0].routing.empty());
  CHECK(r[0].samples[0].tokens.size() == 4);
}

TEST_CASE("block routing: rows land in the KV slots of their tokens, across blocks, and copy with a block",
          "[rollout][routing]") {
  rlx::BlockRouting none;
  CHECK_FALSE(none.enabled());
  rlx::BlockRouting r(/*num_blocks=*/6, /*block_size=*/3, /*layers=*/2, /*top_k=*/2);
  CHECK(r.per_token() == 4);
  CHECK(r.bytes() == 6 * 3 * 4 * 2);
  const std::vector<rlx::BlockId> seq{4, 1, 5};  // tokens 0-2 in block 4, 3-5 in block 1, 6-8 in block 5
  std::vector<int16_t> rows;
  for (int16_t i = 0; i < 7 * 4; ++i) rows.push_back(i);
  r.write(seq, 0, 5, rows.data());
  r.write(seq, 5, 2, rows.data() + 5 * 4);
  std::vector<int16_t> out;
  r.read(seq, 0, 7, out);
  CHECK(out == rows);
  out.clear();
  r.read(std::vector<rlx::BlockId>{1}, 0, 3, out);  // block 1 alone: tokens 3-5
  CHECK(out == std::vector<int16_t>(rows.begin() + 12, rows.begin() + 24));
  r.copy(1, 2);
  out.clear();
  r.read(std::vector<rlx::BlockId>{4, 2}, 3, 6, out);
  CHECK(out == std::vector<int16_t>(rows.begin() + 12, rows.begin() + 24));
  out.clear();
  r.read(std::vector<rlx::BlockId>{0}, 0, 1, out);  // never written
  CHECK(out == std::vector<int16_t>(4, -1));
}
