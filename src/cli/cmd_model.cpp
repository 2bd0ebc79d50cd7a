// rlx model init --arch llama|qwen2 --preset NAME --out DIR [--seed N] [--dtype D]
//                [--vocab-size N] [--tokenizer FILE]
// Writes an HF-format directory (config.json, model.safetensors, tokenizer) with
// random weights that `transformers` can load.
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "rlx/core/log.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx::cli {

void add_model_commands(CLI::App& app, Action& action) {
  auto* model = app.add_subcommand("model", "Create and manage models");
  model->require_subcommand(1);

  struct InitArgs {
    std::string arch = "llama", preset = "tiny", out, dtype = "float32", tokenizer;
    uint64_t seed = 0;
    int64_t vocab_size = 0;
  };
  auto a = std::make_shared<InitArgs>();
  auto* init = model->add_subcommand("init", "Write an HF model directory with freshly initialised weights");
  init->add_option("--arch", a->arch, "llama or qwen2")->check(CLI::IsMember({"llama", "qwen2"}));
  std::string presets;
  for (const auto& p : model_preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  init->add_option("--preset", a->preset, "shape: " + presets);
  init->add_option("--out", a->out, "output directory")->required();
  init->add_option("--seed", a->seed, "initialisation seed");
  init->add_option("--dtype", a->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  init->add_option("--vocab-size", a->vocab_size, "override the preset's vocabulary size");
  init->add_option("--tokenizer", a->tokenizer, "tokenizer file to copy in; its size sets the vocabulary");
  init->callback([a, &action] {
    action = [a] {
      ModelConfig cfg = model_preset(a->preset, *config::enum_from_string<Arch>(a->arch));
      std::unique_ptr<Tokenizer> tok;
      if (!a->tokenizer.empty()) {
        tok = load_tokenizer(a->tokenizer);
        cfg.vocab_size = tok->vocab_size();
        cfg.bos_token_id = tok->bos_id.value_or(-1);
        cfg.eos_token_id = tok->eos_id.value_or(-1);
      }
      if (a->vocab_size > 0) {
        RLX_CHECK(!tok || a->vocab_size >= tok->vocab_size(), "--vocab-size {} is smaller than the tokenizer's {}",
                  a->vocab_size, tok->vocab_size());
        cfg.vocab_size = a->vocab_size;
      }
      auto dtype = to_scalar_type(*config::enum_from_string<DType>(a->dtype));
      Transformer m(cfg, dtype);
      m.init_weights(a->seed);
      save_hf(m, a->out);
      if (tok) std::filesystem::copy_file(a->tokenizer, std::filesystem::path(a->out) / "tokenizer.json",
                                          std::filesystem::copy_options::overwrite_existing);
      std::cout << fmt::format("wrote {} ({} {}, {} parameters, {}) to {}\n", a->preset, a->arch, a->dtype,
                               cfg.num_parameters(), tok ? "with tokenizer" : "no tokenizer", a->out);
      return 0;
    };
  });
}

}  // namespace rlx::cli
