// Uses rlx through its installed headers and library only.
#include <rlx/model/transformer.hpp>
#include <rlx/version.hpp>

#include <iostream>

int main() {
  auto cfg = rlx::model_preset("tiny");
  rlx::Transformer model(cfg);
  model.init_weights(1);
  auto logits = model.forward({.tokens = at::zeros({1, 4}, at::kLong)});
  std::cout << "rlx " << rlx::kVersion << " logits " << logits.sizes() << "\n";
  return logits.size(2) == cfg.vocab_size ? 0 : 1;
}
