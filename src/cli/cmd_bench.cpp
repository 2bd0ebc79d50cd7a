// rlx bench model --preset NAME [--batch B] [--seq T] [--iters N] [--threads K] [--dtype D]
// Forward tokens/s (no grad), forward+backward tokens/s and KV-cache decode tokens/s
// of a randomly initialised model. The last line is JSON.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/model/transformer.hpp"

namespace rlx::cli {

namespace {
template <class F>
double seconds_per_call(int iters, F&& f) {
  f();  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}
}  // namespace

void add_bench_commands(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Benchmarks; each prints a JSON line last");
  bench->require_subcommand(1);
  struct Args {
    std::string preset = "tiny", arch = "llama", dtype = "float32", device = "cpu";
    int64_t batch = 8, seq = 128, decode_steps = 32;
    int iters = 5, threads = 0;
  };
  auto a = std::make_shared<Args>();
  auto* model = bench->add_subcommand("model", "Transformer forward / backward / decode throughput");
  model->add_option("--preset", a->preset, "model shape");
  model->add_option("--arch", a->arch, "llama or qwen2")->check(CLI::IsMember({"llama", "qwen2"}));
  model->add_option("--dtype", a->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  model->add_option("--device", a->device, "cpu or cuda[:N]");
  model->add_option("--batch", a->batch, "sequences per forward")->check(CLI::Range(1, 4096));
  model->add_option("--seq", a->seq, "tokens per sequence")->check(CLI::Range(1, 1 << 20));
  model->add_option("--decode-steps", a->decode_steps, "KV-cache decode steps after a prefill of --seq")->check(CLI::Range(0, 1 << 16));
  model->add_option("--iters", a->iters, "timed iterations")->check(CLI::Range(1, 10000));
  model->add_option("--threads", a->threads, "compute threads (0: all cores); see rlx/core/threads.hpp")->check(CLI::Range(0, 1024));
  model->callback([a, &action] {
    action = [a] {
      const auto plan = set_compute_threads(a->threads);
      ModelConfig cfg = model_preset(a->preset, *config::enum_from_string<Arch>(a->arch));
      const auto dtype = to_scalar_type(*config::enum_from_string<DType>(a->dtype));
      const at::Device device(a->device);
      Transformer m(cfg, dtype, device);
      m.init_weights(0);
      auto tokens = at::randint(cfg.vocab_size, {a->batch, a->seq}, at::TensorOptions().dtype(at::kLong)).to(device);
      auto sync = [&] {
        if (device.is_cuda()) m.hf_parameters().front().second.cpu();  // waits for the stream
      };
      const double fwd_s = seconds_per_call(a->iters, [&] {
        at::NoGradGuard g;
        m.forward({.tokens = tokens});
        sync();
      });
      const double train_s = seconds_per_call(a->iters, [&] {
        m.zero_grad();
        auto logits = m.forward({.tokens = tokens});
        logits.to(at::kFloat).logsumexp(-1).mean().backward();
        sync();
      });
      // Decode: prefill --seq tokens into a KV cache, then --decode-steps single-token steps;
      // only the steps are timed.
      double decode_s = 0;
      if (a->decode_steps > 0) {
        for (int it = 0; it <= a->iters; ++it) {  // iteration 0 warms up
          at::NoGradGuard g;
          DenseKVCache cache(cfg, a->batch, a->seq + a->decode_steps, dtype, device);
          auto next = m.forward({.tokens = tokens}, &cache).select(1, a->seq - 1).argmax(-1).unsqueeze(1);
          sync();
          auto t0 = std::chrono::steady_clock::now();
          for (int64_t s = 0; s < a->decode_steps; ++s)
            next = m.forward({.tokens = next}, &cache).squeeze(1).argmax(-1).unsqueeze(1);
          sync();
          if (it > 0) decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        decode_s /= a->iters;
      }
      const double n = static_cast<double>(a->batch * a->seq);
      nlohmann::json r = {{"bench", "model"},
                          {"preset", a->preset},
                          {"arch", a->arch},
                          {"dtype", a->dtype},
                          {"device", a->device},
                          {"threads", plan.threads()},
                          {"thread_plan", plan.describe()},
                          {"parameters", cfg.num_parameters()},
                          {"batch", a->batch},
                          {"seq", a->seq},
                          {"forward_tokens_per_s", n / fwd_s},
                          {"forward_ms", fwd_s * 1e3},
                          {"train_tokens_per_s", n / train_s},
                          {"train_step_ms", train_s * 1e3}};
      std::cout << fmt::format("{} ({} params) batch {} x seq {} on {} ({})\n", a->preset, cfg.num_parameters(),
                               a->batch, a->seq, a->device, plan.describe());
      std::cout << fmt::format("  forward:          {:>10.0f} tokens/s ({:.1f} ms)\n", n / fwd_s, fwd_s * 1e3);
      std::cout << fmt::format("  forward+backward: {:>10.0f} tokens/s ({:.1f} ms)\n", n / train_s, train_s * 1e3);
      if (a->decode_steps > 0) {
        const double dec = static_cast<double>(a->batch * a->decode_steps);
        r["decode_steps"] = a->decode_steps;
        r["decode_step_ms"] = decode_s * 1e3 / static_cast<double>(a->decode_steps);
        r["decode_tokens_per_s"] = dec / decode_s;
        std::cout << fmt::format("  kv-cache decode:  {:>10.0f} tokens/s ({:.2f} ms per step of {} tokens)\n", dec / decode_s,
                                 decode_s * 1e3 / static_cast<double>(a->decode_steps), a->batch);
      }
      std::cout << r.dump() << std::endl;
      return 0;
    };
  });
}

}  // namespace rlx::cli
