// The run's tokenizer and starting model, as every role builds them.
#include "rlx/launch/roles.hpp"

#include "rlx/core/torch_compat.hpp"
#include "rlx/model/hf.hpp"

namespace rlx::launch {

namespace fs = std::filesystem;
using nlohmann::json;

std::shared_ptr<const Tokenizer> run_tokenizer(const RunConfig& cfg) {
  if (!cfg.tokenizer.path.empty()) return load_tokenizer(cfg.tokenizer.path);
  if (!cfg.model.path.empty()) return load_tokenizer(fs::path(cfg.model.path) / "tokenizer.json");
  return std::make_shared<CharTokenizer>(default_char_alphabet());
}

std::shared_ptr<Transformer> initial_model(const RunConfig& cfg, const Tokenizer& tokenizer,
                                           std::optional<at::Device> device) {
  const auto dtype = to_scalar_type(cfg.model.dtype);
  const at::Device on = device.value_or(at::Device(cfg.model.device));
  if (!cfg.model.path.empty()) return load_hf(cfg.model.path, {.dtype = dtype, .device = on});
  auto mc = model_preset(cfg.model.preset, cfg.model.arch);
  mc.vocab_size = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : tokenizer.vocab_size();
  auto model = std::make_shared<Transformer>(mc, dtype, on);
  model->init_weights(cfg.run.seed);
  return model;
}

void add_engine_adapters(Transformer& model, const RunConfig& cfg) {
  if (cfg.model.lora.enabled())
    model.add_lora(cfg.model.lora, cfg.rollout.lora_merged ? LoraMode::merged : LoraMode::unmerged);
}

void write_tokenizer(const RunConfig& cfg, const fs::path& file) {
  if (const auto tok = run_tokenizer(cfg); auto* ct = dynamic_cast<const CharTokenizer*>(tok.get()))
    ct->save(file);
  else
    fs::copy_file(cfg.tokenizer.path.empty() ? fs::path(cfg.model.path) / "tokenizer.json" : fs::path(cfg.tokenizer.path),
                  file, fs::copy_options::overwrite_existing);
}

}  // namespace rlx::launch
