// rlx bench model --preset NAME [--batch B] [--seq T] [--iters N] [--threads K] [--dtype D]
// Forward tokens/s (no grad), forward+backward tokens/s and KV-cache decode tokens/s
// of a randomly initialised model. The last line is JSON.
//
// rlx bench sampler --preset NAME [--batch B] [--prompt P] [--new N] [--n G] [--naive] [--lora-rank R --lora-merged 0|1]
//                   [--trace DIR [--trace-steps N]]
// The rollout engine generating B requests (x G samples) of P prompt tokens and N new
// tokens: output tokens/s, ms per decode step, prefill tokens/s, peak memory; with
// --naive the same generation by full recompute (no KV cache) and the ratio.
#include <c10/core/GradMode.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "op_profile.hpp"
#include "rlx/core/rng.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/core/torch_compat.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/transformer.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::cli {

namespace {
template <class F>
double seconds_per_call(int iters, F&& f) {
  f();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct SamplerArgs {
  std::string model_dir, preset = "tiny", arch = "llama", dtype = "float32", device = "cpu";
  int64_t batch = 32, prompt = 16, new_tokens = 64, n = 1, block_size = 16, max_batch_tokens = 4096;
  double temperature = 1.0, kv_cache_mb = 64;
  int64_t top_k = 0;  // the sampler's filtered path (top-k / top-p / min-p), off by default
  double top_p = 1.0, min_p = 0.0;
  int iters = 3, threads = 0;
  bool naive = false;
  bool cuda_graphs = true;
  bool overlap = true;
  int64_t lora_rank = 0;  // > 0: adapters on every projection (random), applied as lora_merged says
  bool lora_merged = true;
  std::string trace_dir;   // then a kernel trace of trace_steps decode steps (cli::KernelTrace)
  int64_t trace_steps = 5;
};

// The requests again, past their prefill and a few decode steps (graphs captured, the
// pipeline full), then `steps` decode steps under the kernel trace; the rest run out untraced.
nlohmann::json trace_decode(Engine& engine, const std::vector<GenerationRequest>& requests, int64_t steps,
                            const std::string& dir, bool cuda) {
  for (const auto& r : requests) engine.add(r);
  int64_t steady = 0;
  while (engine.has_work() && steady < 3) {
    const auto before = engine.stats().prefill_tokens;
    engine.step();
    steady = engine.stats().prefill_tokens == before ? steady + 1 : 0;
  }
  KernelTrace trace;
  trace.start(cuda);
  int64_t traced = 0;
  for (; traced < steps && engine.has_work(); ++traced) engine.step();
  compat::synchronize(cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU));
  auto summary = trace.stop(dir, static_cast<double>(std::max<int64_t>(traced, 1)));
  summary["steps"] = traced;
  while (engine.has_work()) engine.step();
  return summary;
}

// The model to generate with: a preset's, randomly initialised, or a Hugging Face directory's.
std::shared_ptr<Transformer> sampler_model(const SamplerArgs& a, at::ScalarType dtype, const at::Device& device) {
  if (a.model_dir.empty()) {
    auto model =
        std::make_shared<Transformer>(model_preset(a.preset, *config::enum_from_string<Arch>(a.arch)), dtype, device);
    // On a GPU the weights are drawn there (a 30B shape in seconds; timing needs no
    // machine-independent values).
    model->init_weights(0, /*on_device=*/device.is_cuda());
    return model;
  }
  return load_hf(a.model_dir, {.dtype = dtype, .device = device});
}

// a.batch requests of a.prompt random tokens (a fixed stream).
std::vector<GenerationRequest> sampler_requests(const SamplerArgs& a, const SamplingParams& params,
                                                int64_t vocab_size) {
  std::vector<GenerationRequest> requests;
  RngStream rng(0, hash_name("bench.prompts"));
  for (int64_t i = 0; i < a.batch; ++i) {
    GenerationRequest r{.id = fmt::format("b{}", i), .params = params, .seed = 1};
    for (int64_t t = 0; t < a.prompt; ++t) r.prompt.push_back(static_cast<TokenId>(rng.uniform_int(0, vocab_size - 1)));
    requests.push_back(std::move(r));
  }
  return requests;
}

// LoRA: what a weight update costs the engine (the adapters copied in, and merged when
// merging), timed over a few updates of random adapters: ms per update, bytes loaded.
std::pair<double, int64_t> time_lora_updates(Transformer& model, Engine& engine, const at::Device& device) {
  double lora_update_ms = 0;
  int64_t lora_update_bytes = 0;
  auto update = model.sync_parameters();
  for (auto& [n, t] : update) t = at::randn(t.sizes(), at::TensorOptions().dtype(at::kFloat)) * 0.01;
  constexpr int kUpdates = 5;
  for (int v = 1; v <= kUpdates; ++v) {
    const auto t0 = std::chrono::steady_clock::now();
    lora_update_bytes = engine.load_weights(v, update);
    compat::synchronize(device);
    lora_update_ms += seconds_since(t0) * 1e3 / kUpdates;
  }
  return {lora_update_ms, lora_update_bytes};
}

// The engine's timed iterations, summed.
struct EngineTimes {
  double total_s = 0, decode_s = 0, prefill_s = 0, capture_steps_s = 0;
  int64_t decode_steps = 0, capture_steps = 0, prefill_tokens = 0, out_tokens = 0, peak_blocks = 0;
};

// Each iteration: every request from an empty engine; steps are timed one by one and
// split into decode-only steps, decode steps that captured a CUDA graph (a new batch or
// context bucket's first step: tens of ms once a run, which in 128 steps would be a third of
// the mean), and steps that prefill.
EngineTimes time_engine(Engine& engine, const std::vector<GenerationRequest>& requests, const SamplerArgs& a) {
  EngineTimes e;
  for (int it = 0; it < a.iters; ++it) {
    for (const auto& r : requests) engine.add(r);
    const auto t_all = std::chrono::steady_clock::now();
    while (engine.has_work()) {
      const auto before = engine.stats();
      const auto t0 = std::chrono::steady_clock::now();
      engine.step();
      const double dt = seconds_since(t0);
      const auto after = engine.stats();
      e.peak_blocks = std::max<int64_t>(e.peak_blocks, after.total_blocks - after.free_blocks);
      if (after.prefill_tokens == before.prefill_tokens && after.graph_captures != before.graph_captures) {
        e.capture_steps_s += dt;
        ++e.capture_steps;
      } else if (after.prefill_tokens == before.prefill_tokens) {
        e.decode_s += dt;
        ++e.decode_steps;
      } else {
        e.prefill_s += dt;
        e.prefill_tokens += after.prefill_tokens - before.prefill_tokens;
      }
    }
    e.total_s += seconds_since(t_all);
    e.out_tokens += a.batch * a.n * a.new_tokens;
  }
  return e;
}

// The same generation without a KV cache (every step recomputes the whole sequence): its
// seconds.
double time_naive(Transformer& model, const std::vector<GenerationRequest>& requests, const SamplingParams& params,
                  const SamplerArgs& a, const at::Device& device) {
  c10::NoGradGuard g;
  const int64_t rows = a.batch * a.n;
  auto tokens = at::empty({rows, a.prompt}, at::TensorOptions().dtype(at::kLong));
  for (int64_t i = 0; i < rows; ++i) {
    const auto& p = requests[static_cast<size_t>(i / a.n)].prompt;
    for (int64_t t = 0; t < a.prompt; ++t) tokens[i][t] = p[static_cast<size_t>(t)];
  }
  tokens = tokens.to(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < a.new_tokens; ++step) {
    auto logits = model.forward({.tokens = tokens}).select(1, tokens.size(1) - 1);
    SamplingBatch b;
    for (int64_t i = 0; i < rows; ++i)
      b.add(params, sampling_uniform(1, requests[static_cast<size_t>(i / a.n)].id, i % a.n, tokens.size(1)));
    tokens = at::cat({tokens, sample(logits, b).tokens.unsqueeze(1)}, 1);
  }
  tokens.cpu();
  return seconds_since(t0);
}

int bench_sampler(const SamplerArgs& a) {
  const auto t_setup = std::chrono::steady_clock::now();
  const auto plan = set_compute_threads(a.threads);
  const auto dtype = to_scalar_type(*config::enum_from_string<DType>(a.dtype));
  const at::Device device(a.device);
  std::shared_ptr<Transformer> model = sampler_model(a, dtype, device);
  const ModelConfig& cfg = model->config();
  const std::string name = a.model_dir.empty() ? a.preset : a.model_dir;
  const SamplingParams params{.temperature = a.temperature,
                              .top_k = a.top_k,
                              .top_p = a.top_p,
                              .min_p = a.min_p,
                              .max_new_tokens = a.new_tokens,
                              .n = a.n,
                              .ignore_eos = true};
  const std::vector<GenerationRequest> requests = sampler_requests(a, params, cfg.vocab_size);
  if (a.lora_rank > 0) model->add_lora({.rank = a.lora_rank}, a.lora_merged ? LoraMode::merged : LoraMode::unmerged);
  Engine engine(model, {.block_size = static_cast<int32_t>(a.block_size),
                        .kv_cache_mb = a.kv_cache_mb,
                        .max_batch_tokens = a.max_batch_tokens,
                        .max_running = std::max<int64_t>(256, a.batch * a.n),
                        .cuda_graphs = a.cuda_graphs,
                        .overlap = a.overlap});
  const auto [lora_update_ms, lora_update_bytes] =
      a.lora_rank > 0 ? time_lora_updates(*model, engine, device) : std::pair<double, int64_t>{0, 0};
  // Warm-up: one request of a few tokens (kernels loaded, the batch-1 graph captured), short
  // so that a profiler's launch counts (ncu --launch-skip) reach the timed batch soon.
  GenerationRequest warm = requests.front();
  warm.params.max_new_tokens = std::min<int64_t>(4, a.new_tokens);
  engine.generate({warm});
  const double setup_s = seconds_since(t_setup);

  const EngineTimes e = time_engine(engine, requests, a);
  const double tokens_per_s = static_cast<double>(e.out_tokens) / e.total_s;
  const auto st = engine.stats();  // before the traced steps
  const auto t_trace = std::chrono::steady_clock::now();
  const nlohmann::json trace =
      a.trace_dir.empty() ? nlohmann::json(nullptr) : trace_decode(engine, requests, a.trace_steps, a.trace_dir, device.is_cuda());
  const double trace_s = a.trace_dir.empty() ? 0.0 : seconds_since(t_trace);
  nlohmann::json r = {
      {"bench", "sampler"},
      {"model", name},
      {"arch", std::string(config::enum_to_string(cfg.arch))},
      {"dtype", a.dtype},
      {"device", a.device},
      {"threads", plan.threads()},
      {"thread_plan", plan.describe()},
      {"batch", a.batch},
      {"n", a.n},
      {"sampling", {{"temperature", a.temperature}, {"top_k", a.top_k}, {"top_p", a.top_p}, {"min_p", a.min_p}}},
      {"prompt", a.prompt},
      {"new_tokens", a.new_tokens},
      {"output_tokens_per_s", tokens_per_s},
      {"decode_step_ms", e.decode_steps ? e.decode_s * 1e3 / static_cast<double>(e.decode_steps) : 0.0},
      {"decode_steps", e.decode_steps},
      {"capture_steps", e.capture_steps},  // decode steps that captured a graph: not in decode_step_ms
      {"capture_step_ms", e.capture_steps ? e.capture_steps_s * 1e3 / static_cast<double>(e.capture_steps) : 0.0},
      {"prefill_tokens_per_s", e.prefill_s > 0 ? static_cast<double>(e.prefill_tokens) / e.prefill_s : 0.0},
      {"kv_block_bytes", PagedKVCache::block_bytes(cfg, static_cast<int32_t>(a.block_size), dtype)},
      {"kv_blocks_peak", e.peak_blocks},
      {"kv_peak_mb",
       static_cast<double>(e.peak_blocks * PagedKVCache::block_bytes(cfg, static_cast<int32_t>(a.block_size), dtype)) /
           (1 << 20)},
      {"preemptions", st.preemptions},
      {"graph_steps", st.graph_steps},
      {"graph_captures", st.graph_captures},  // the warm-up's included
      {"graph_capture_s", st.graph_capture_s},
      {"overlap", a.overlap},
      {"overlapped_steps", st.overlapped_steps},
      {"discarded_rows", st.discarded_rows},
      {"peak_rss_mb", peak_rss_mb()},
      {"lora_rank", a.lora_rank},
      {"trace", trace},
      {"setup_s", setup_s},  // model, engine and warm-up
      {"run_s", e.total_s},
      {"trace_s", trace_s}};
  if (a.lora_rank > 0) {
    r["lora_merged"] = a.lora_merged;
    r["lora_update_ms"] = lora_update_ms;
    r["lora_update_bytes"] = lora_update_bytes;
  }
  const int64_t device_peak = compat::device_peak_bytes(device);
  if (device_peak >= 0) r["device_peak_mb"] = static_cast<double>(device_peak) / (1 << 20);
  std::cout << fmt::format("{} ({} params) on {} ({}): {} requests x {} samples, prompt {}, {} new tokens\n", name,
                           cfg.num_parameters(), a.device, plan.describe(), a.batch, a.n, a.prompt, a.new_tokens);
  std::cout << fmt::format("  engine: {:>10.0f} output tokens/s, {:.2f} ms per decode step, {:.0f} prefill tokens/s\n",
                           tokens_per_s, r["decode_step_ms"].get<double>(), r["prefill_tokens_per_s"].get<double>());
  if (a.naive) {
    const double naive_s = time_naive(*model, requests, params, a, device);
    const double naive_tps = static_cast<double>(a.batch * a.n * a.new_tokens) / naive_s;
    r["naive_output_tokens_per_s"] = naive_tps;
    r["speedup_vs_naive"] = tokens_per_s / naive_tps;
    std::cout << fmt::format("  naive (full recompute, no KV cache): {:>10.0f} output tokens/s -> engine is {:.1f}x\n",
                             naive_tps, tokens_per_s / naive_tps);
  }
  std::cout << r.dump() << std::endl;
  return 0;
}

// The options of `rlx bench model`.
struct ModelBenchArgs {
  std::string preset = "tiny", arch = "llama", dtype = "float32", device = "cpu";
  int64_t batch = 8, seq = 128, decode_steps = 32;
  int iters = 5, threads = 0;
};

// Forward, forward+backward and KV-cache decode throughput of a randomly initialised model.
int bench_model(const ModelBenchArgs& a) {
  const auto plan = set_compute_threads(a.threads);
  ModelConfig cfg = model_preset(a.preset, *config::enum_from_string<Arch>(a.arch));
  const auto dtype = to_scalar_type(*config::enum_from_string<DType>(a.dtype));
  const at::Device device(a.device);
  Transformer m(cfg, dtype, device);
  m.init_weights(0);
  auto tokens = at::randint(cfg.vocab_size, {a.batch, a.seq}, at::TensorOptions().dtype(at::kLong)).to(device);
  auto sync = [&] {
    if (device.is_cuda()) m.hf_parameters().front().second.cpu();  // waits for the stream
  };
  const double fwd_s = seconds_per_call(a.iters, [&] {
    c10::NoGradGuard g;
    m.forward({.tokens = tokens});
    sync();
  });
  const double train_s = seconds_per_call(a.iters, [&] {
    m.zero_grad();
    auto logits = m.forward({.tokens = tokens});
    logits.to(at::kFloat).logsumexp(-1).mean().backward();
    sync();
  });
  // Decode: prefill --seq tokens into a KV cache, then --decode-steps single-token steps;
  // only the steps are timed.
  double decode_s = 0;
  if (a.decode_steps > 0) {
    for (int it = 0; it <= a.iters; ++it) {  // iteration 0 warms up
      c10::NoGradGuard g;
      DenseKVCache cache(cfg, a.batch, a.seq + a.decode_steps, dtype, device);
      auto next = m.forward({.tokens = tokens}, &cache).select(1, a.seq - 1).argmax(-1).unsqueeze(1);
      sync();
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < a.decode_steps; ++s)
        next = m.forward({.tokens = next}, &cache).squeeze(1).argmax(-1).unsqueeze(1);
      sync();
      if (it > 0) decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    decode_s /= a.iters;
  }
  const double n = static_cast<double>(a.batch * a.seq);
  nlohmann::json r = {{"bench", "model"},
                      {"preset", a.preset},
                      {"arch", a.arch},
                      {"dtype", a.dtype},
                      {"device", a.device},
                      {"threads", plan.threads()},
                      {"thread_plan", plan.describe()},
                      {"parameters", cfg.num_parameters()},
                      {"batch", a.batch},
                      {"seq", a.seq},
                      {"forward_tokens_per_s", n / fwd_s},
                      {"forward_ms", fwd_s * 1e3},
                      {"train_tokens_per_s", n / train_s},
                      {"train_step_ms", train_s * 1e3}};
  std::cout << fmt::format("{} ({} params) batch {} x seq {} on {} ({})\n", a.preset, cfg.num_parameters(), a.batch,
                           a.seq, a.device, plan.describe());
  std::cout << fmt::format("  forward:          {:>10.0f} tokens/s ({:.1f} ms)\n", n / fwd_s, fwd_s * 1e3);
  std::cout << fmt::format("  forward+backward: {:>10.0f} tokens/s ({:.1f} ms)\n", n / train_s, train_s * 1e3);
  if (a.decode_steps > 0) {
    const double dec = static_cast<double>(a.batch * a.decode_steps);
    r["decode_steps"] = a.decode_steps;
    r["decode_step_ms"] = decode_s * 1e3 / static_cast<double>(a.decode_steps);
    r["decode_tokens_per_s"] = dec / decode_s;
    std::cout << fmt::format("  kv-cache decode:  {:>10.0f} tokens/s ({:.2f} ms per step of {} tokens)\n",
                             dec / decode_s, decode_s * 1e3 / static_cast<double>(a.decode_steps), a.batch);
  }
  std::cout << r.dump() << std::endl;
  return 0;
}
}  // namespace

void add_bench_commands(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Benchmarks; each prints a JSON line last");
  bench->require_subcommand(1);
  auto a = std::make_shared<ModelBenchArgs>();
  auto* model = bench->add_subcommand("model", "Transformer forward / backward / decode throughput");
  model->add_option("--preset", a->preset, "model shape");
  add_arch_option(*model, a->arch);
  model->add_option("--dtype", a->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  model->add_option("--device", a->device, "cpu or cuda[:N]");
  model->add_option("--batch", a->batch, "sequences per forward")->check(CLI::Range(1, 4096));
  model->add_option("--seq", a->seq, "tokens per sequence")->check(CLI::Range(1, 1 << 20));
  model->add_option("--decode-steps", a->decode_steps, "KV-cache decode steps after a prefill of --seq")->check(CLI::Range(0, 1 << 16));
  model->add_option("--iters", a->iters, "timed iterations")->check(CLI::Range(1, 10000));
  model->add_option("--threads", a->threads, "compute threads (0: all cores); see rlx/core/threads.hpp")->check(CLI::Range(0, 1024));
  model->callback([a, &action] { action = [a] { return bench_model(*a); }; });

  auto s = std::make_shared<SamplerArgs>();
  auto* sampler = bench->add_subcommand("sampler", "Rollout engine generation throughput (vs naive full recompute)");
  sampler->add_option("--model", s->model_dir, "HF model directory (default: --preset with random weights)");
  sampler->add_option("--preset", s->preset, "model shape");
  add_arch_option(*sampler, s->arch);
  sampler->add_option("--dtype", s->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  sampler->add_option("--device", s->device, "cpu or cuda[:N]");
  sampler->add_option("--batch", s->batch, "requests")->check(CLI::Range(1, 65536));
  sampler->add_option("--n", s->n, "samples per request (they share the prompt's KV blocks)")->check(CLI::Range(1, 4096));
  sampler->add_option("--prompt", s->prompt, "prompt tokens")->check(CLI::Range(1, 1 << 20));
  sampler->add_option("--new", s->new_tokens, "new tokens per sample")->check(CLI::Range(1, 1 << 20));
  sampler->add_option("--temperature", s->temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
  sampler->add_option("--top-k", s->top_k, "keep the k most likely tokens (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  sampler->add_option("--top-p", s->top_p, "nucleus probability (1: off)")->check(CLI::Range(0.0, 1.0));
  sampler->add_option("--min-p", s->min_p, "drop tokens below min_p times the top probability (0: off)")
      ->check(CLI::Range(0.0, 1.0));
  sampler->add_option("--block-size", s->block_size, "KV block size")->check(CLI::Range(1, 1024));
  sampler->add_option("--kv-cache-mb", s->kv_cache_mb, "KV-cache pool (MiB)");
  sampler->add_option("--max-batch-tokens", s->max_batch_tokens, "tokens per forward")->check(CLI::Range(1, 1 << 24));
  sampler->add_option("--iters", s->iters, "timed repetitions")->check(CLI::Range(1, 1000));
  sampler->add_option("--threads", s->threads, "compute threads (0: all cores)")->check(CLI::Range(0, 1024));
  sampler->add_flag("--naive", s->naive, "also time full recompute without a KV cache");
  sampler->add_option("--lora-rank", s->lora_rank, "LoRA adapters of this rank on every projection (0: none)")
      ->check(CLI::Range(0, 4096));
  sampler->add_option("--lora-merged", s->lora_merged, "LoRA: merged into the weights at each update (1) or added per forward (0)");
  sampler->add_option("--cuda-graphs", s->cuda_graphs, "on CUDA, replay decode steps as CUDA graphs (1) or run eagerly (0)");
  sampler->add_option("--overlap", s->overlap,
                      "launch decode step k+1 before step k's tokens are read back (1) or one step at a time (0)");
  sampler->add_option("--trace", s->trace_dir,
                      "then a kernel trace of --trace-steps decode steps into DIR (kernels.csv; trace.json where LibTorch has Kineto)");
  sampler->add_option("--trace-steps", s->trace_steps, "decode steps the trace covers")->check(CLI::Range(1, 1000));
  sampler->callback([s, &action] { action = [s] { return bench_sampler(*s); }; });
}

}  // namespace rlx::cli
