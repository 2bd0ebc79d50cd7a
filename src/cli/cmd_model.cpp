// rlx model init --arch FAMILY --preset NAME --out DIR [--seed N] [--dtype D]
//                [--vocab-size N] [--tokenizer FILE]
// Writes an HF-format directory (config.json, model.safetensors, tokenizer) with
// random weights that `transformers` can load.
// rlx model logits --model DIR --tokens '[[1, 2, 3]]' [--dtype D] [--device DEV]
// Prints the full-forward logits as one JSON line (for parity checks against peers).
#include <c10/core/GradMode.h>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "rlx/core/log.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/reward_model.hpp"
#include "rlx/model/tokenizer.hpp"

namespace rlx::cli {

namespace {
// --tokens: a JSON list of non-empty lists of integer ids (all of one length when `equal`).
std::vector<std::vector<int64_t>> token_rows(const std::string& text, bool equal) {
  nlohmann::json ids;
  try {
    ids = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--tokens is not JSON: {}", e.what()));
  }
  RLX_CHECK(ids.is_array() && !ids.empty(), "--tokens must be a non-empty list of non-empty lists of ids");
  std::vector<std::vector<int64_t>> rows;
  for (const auto& row : ids) {
    RLX_CHECK(row.is_array() && !row.empty(), "--tokens: {} is not a non-empty list", row.dump());
    RLX_CHECK(!equal || row.size() == ids[0].size(), "--tokens rows must have equal lengths");
    auto& out = rows.emplace_back();
    for (const auto& t : row) {
      RLX_CHECK(t.is_number_integer(), "--tokens: {} is not an integer id", t.dump());
      out.push_back(t.get<int64_t>());
    }
  }
  return rows;
}
}  // namespace

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
  add_arch_option(*init, a->arch);
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

  struct LogitsArgs {
    std::string model, tokens, dtype = "float32", device = "cpu";
  };
  auto l = std::make_shared<LogitsArgs>();
  auto* logits = model->add_subcommand("logits", "Print the logits of a token batch as JSON (last line)");
  logits->add_option("--model", l->model, "HF model directory")->required();
  logits->add_option("--tokens", l->tokens, "token ids as a JSON list of equal-length lists")->required();
  logits->add_option("--dtype", l->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  logits->add_option("--device", l->device, "cpu or cuda[:N]");
  logits->callback([l, &action] {
    action = [l] {
      const auto ids = token_rows(l->tokens, /*equal=*/true);
      std::vector<int64_t> flat;
      for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
      const int64_t B = static_cast<int64_t>(ids.size()), T = static_cast<int64_t>(ids[0].size());
      auto m = load_hf(l->model, {.dtype = to_scalar_type(*config::enum_from_string<DType>(l->dtype)),
                                  .device = at::Device(l->device)});
      c10::NoGradGuard g;
      auto out = m->forward({.tokens = at::tensor(flat).view({B, T})}).to(at::kFloat).cpu().contiguous();
      nlohmann::json rows = nlohmann::json::array();
      const float* p = out.data_ptr<float>();
      const int64_t V = out.size(2);
      for (int64_t b = 0; b < B; ++b) {
        nlohmann::json seq = nlohmann::json::array();
        for (int64_t t = 0; t < T; ++t) seq.push_back(std::vector<float>(p + (b * T + t) * V, p + (b * T + t + 1) * V));
        rows.push_back(std::move(seq));
      }
      std::cout << nlohmann::json{{"shape", {B, T, V}}, {"logits", rows}}.dump() << std::endl;
      return 0;
    };
  });

  auto sc = std::make_shared<LogitsArgs>();
  auto* score = model->add_subcommand("score", "Print a reward model's score of each token sequence as JSON (last line)");
  score->add_option("--model", sc->model, "HF sequence-classifier directory (`rlx rm` writes one)")->required();
  score->add_option("--tokens", sc->tokens, "token ids as a JSON list of non-empty lists (any lengths)")->required();
  score->add_option("--dtype", sc->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  score->add_option("--device", sc->device, "cpu or cuda[:N]");
  score->callback([sc, &action] {
    action = [sc] {
      const auto seqs = token_rows(sc->tokens, /*equal=*/false);
      auto rm = RewardModel::load(sc->model, {.dtype = to_scalar_type(*config::enum_from_string<DType>(sc->dtype)),
                                              .device = at::Device(sc->device)});
      std::cout << nlohmann::json{{"scores", rm.score(seqs)}}.dump() << std::endl;
      return 0;
    };
  });
}

}  // namespace rlx::cli
