// Example 01: load an HF model directory (or initialise a tiny one), tokenize a
// prompt, and sample a continuation token by token through the KV cache.
//
//   rlx model init --preset tiny --out /tmp/tiny --tokenizer char.json
//   ./rlx_example_generate /tmp/tiny "12+34=" 32
//   // prompt: "12+34="
//   // continuation (32 tokens, seed 0): ... (random weights give random text)
#include <c10/core/GradMode.h>
#include <iostream>
#include <string>

#include "rlx/core/rng.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/model/tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " MODEL_DIR PROMPT [NEW_TOKENS] [TEMPERATURE]\n";
    return 2;
  }
  try {
    rlx::set_compute_threads(0);
    const std::string dir = argv[1], prompt = argv[2];
    const int64_t new_tokens = argc > 3 ? std::stoll(argv[3]) : 32;
    const double temperature = argc > 4 ? std::stod(argv[4]) : 1.0;
    auto model = rlx::load_hf(dir);
    auto tok = rlx::load_tokenizer(std::string(dir) + "/tokenizer.json");
    std::vector<rlx::TokenId> ids = tok->encode(prompt);
    RLX_CHECK(!ids.empty(), "the prompt encodes to no tokens");

    c10::NoGradGuard no_grad;
    rlx::DenseKVCache cache(model->config(), 1, static_cast<int64_t>(ids.size()) + new_tokens, model->dtype(), model->device());
    auto input = at::tensor(std::vector<int64_t>(ids.begin(), ids.end())).unsqueeze(0);
    rlx::RngStream rng(/*seed=*/0);
    std::vector<rlx::TokenId> out;
    for (int64_t i = 0; i < new_tokens; ++i) {
      auto logits = model->forward({.tokens = input}, &cache).select(1, -1).squeeze(0).to(at::kFloat);
      auto probs = at::softmax(logits / temperature, -1);
      // Inverse-CDF sampling with rlx's counter-based generator.
      auto cdf = probs.cumsum(0);
      const double u = rng.uniform();
      int64_t next = std::min<int64_t>((cdf < u).sum().item<int64_t>(), cdf.size(0) - 1);
      out.push_back(static_cast<rlx::TokenId>(next));
      if (tok->eos_id && next == *tok->eos_id) break;
      input = at::full({1, 1}, next, at::kLong);
    }
    std::cout << "prompt: \"" << prompt << "\"\n";
    std::cout << "continuation (" << out.size() << " tokens, seed 0): " << tok->decode(out, /*skip_special=*/true) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
