// rlx generate --model DIR --prompt TEXT [--n N] [--temperature T] [--top-k K] [--top-p P]
//              [--min-p P] [--max-tokens N] [--stop STR]... [--stop-token ID]... [--seed S]
//              [--json] [--tokenizer FILE] [--dtype D] [--device DEV] [--kv-cache-mb MB]
// Samples N continuations of a prompt with the rollout engine (the sampler RL uses)
// and prints them, or one JSON line with tokens, log-probs and finish reasons.
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/rollout/engine.hpp"

namespace rlx::cli {

void add_generate_command(CLI::App& app, Action& action) {
  struct Args {
    std::string model, prompt, tokenizer, dtype = "float32", device = "cpu";
    SamplingParams params{.max_new_tokens = 64};
    uint64_t seed = 0;
    double kv_cache_mb = 256;
    int threads = 0;
    bool json = false, add_special = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Sample continuations of a prompt with the rollout engine");
  cmd->add_option("--model", a->model, "HF model directory")->required();
  cmd->add_option("--prompt", a->prompt, "prompt text")->required();
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer file (default: the model directory's tokenizer.json)");
  cmd->add_option("--n", a->params.n, "samples");
  cmd->add_option("--temperature", a->params.temperature, "softmax temperature; 0 is greedy");
  cmd->add_option("--top-k", a->params.top_k, "keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", a->params.top_p, "nucleus probability (1: off)");
  cmd->add_option("--min-p", a->params.min_p, "drop tokens below min-p times the most likely (0: off)");
  cmd->add_option("--max-tokens", a->params.max_new_tokens, "tokens to generate at most");
  cmd->add_option("--stop", a->params.stop_strings, "stop string (repeatable)");
  cmd->add_option("--stop-token", a->params.stop_token_ids, "stop token id (repeatable)");
  cmd->add_flag("--ignore-eos", a->params.ignore_eos, "keep going past the EOS token");
  cmd->add_flag("--add-special", a->add_special, "apply the tokenizer's template (e.g. a BOS token) to the prompt");
  cmd->add_option("--seed", a->seed, "sampling seed");
  cmd->add_option("--dtype", a->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  cmd->add_option("--device", a->device, "cpu or cuda[:N]");
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV-cache pool size in MiB");
  cmd->add_option("--threads", a->threads, "compute threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_flag("--json", a->json, "print one JSON line instead of text");
  cmd->callback([a, &action] {
    action = [a] {
      set_compute_threads(a->threads);
      const auto dtype = to_scalar_type(*config::enum_from_string<DType>(a->dtype));
      auto model = load_hf(a->model, {.dtype = dtype, .device = at::Device(a->device)});
      const std::filesystem::path tok_file =
          a->tokenizer.empty() ? std::filesystem::path(a->model) / "tokenizer.json" : std::filesystem::path(a->tokenizer);
      std::shared_ptr<const Tokenizer> tok = load_tokenizer(tok_file);
      Engine engine(model, {.kv_cache_mb = a->kv_cache_mb}, tok);
      const auto prompt = tok->encode(a->prompt, {.add_special_tokens = a->add_special});
      auto r = engine.generate({{.id = "prompt", .prompt = prompt, .params = a->params, .seed = a->seed}}).at(0);
      // Ids past the tokenizer's vocabulary (padded embedding rows) have no text.
      auto text_of = [&](const std::vector<TokenId>& ids) {
        std::vector<TokenId> known;
        for (TokenId t : ids)
          if (t < tok->vocab_size()) known.push_back(t);
        return tok->decode(known);
      };
      if (a->json) {
        nlohmann::json out = {{"prompt_tokens", prompt}, {"samples", nlohmann::json::array()}};
        for (const auto& s : r.samples)
          out["samples"].push_back({{"text", text_of(s.tokens)},
                                    {"tokens", s.tokens},
                                    {"logprobs", s.logprobs},
                                    {"finish", to_string(s.finish)},
                                    {"stop", s.stop_string}});
        std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
        return 0;
      }
      for (size_t i = 0; i < r.samples.size(); ++i) {
        const auto& s = r.samples[i];
        double sum = 0;
        for (float lp : s.logprobs) sum += lp;
        std::cout << fmt::format("--- sample {} ({} tokens, finish {}, mean log-prob {:.3f}) ---\n", i, s.tokens.size(),
                                 to_string(s.finish), s.tokens.empty() ? 0.0 : sum / static_cast<double>(s.tokens.size()));
        std::cout << a->prompt << text_of(s.tokens) << "\n";
      }
      return 0;
    };
  });
}

}  // namespace rlx::cli
