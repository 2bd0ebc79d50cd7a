#include "rlx/model/hf.hpp"

#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include "../helpers.hpp"
#include "rlx/model/safetensors.hpp"

using Catch::Matchers::Contains;
using nlohmann::json;
using rlx::test::TempDir;

TEST_CASE("hf: config.json round trip for llama and qwen2", "[hf]") {
  for (auto arch : {rlx::Arch::llama, rlx::Arch::qwen2}) {
    auto c = rlx::model_preset("small", arch);
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.tie_word_embeddings = arch == rlx::Arch::qwen2;
    if (arch == rlx::Arch::llama) c.rope_scaling = {.type = rlx::RopeType::llama3, .factor = 8.0, .low_freq_factor = 1.0,
                                                    .high_freq_factor = 4.0, .original_max_position_embeddings = 1024};
    auto j = rlx::model_config_to_hf(c, at::kBFloat16);
    CHECK(j["torch_dtype"] == "bfloat16");
    CHECK(j["architectures"][0] == (arch == rlx::Arch::qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    auto back = rlx::model_config_from_hf(j, "config.json");
    CHECK(back == c);
  }
}

TEST_CASE("hf: config.json from transformers, including the v5 rope_parameters layout", "[hf]") {
  auto j = json::parse(R"({"model_type":"qwen2","vocab_size":1000,"hidden_size":64,"intermediate_size":128,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rms_norm_eps":1e-6,
    "rope_parameters":{"rope_type":"default","rope_theta":1000000.0},"tie_word_embeddings":true,
    "eos_token_id":[5,6],"use_sliding_window":false,"dtype":"bfloat16"})");
  auto c = rlx::model_config_from_hf(j, "cfg");
  CHECK(c.arch == rlx::Arch::qwen2);
  CHECK(c.head_dim == 16);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.qkv_bias);
  CHECK(c.eos_token_id == 5);
  CHECK(c.bos_token_id == -1);

  auto bad = j;
  bad["model_type"] = "gpt_neox";
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("model_type 'gpt_neox' is not supported"));
  bad = j;
  bad.erase("hidden_size");
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("cfg: hidden_size: required field missing"));
  bad = j;
  bad["rope_parameters"]["rope_type"] = "yarn";
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("rope type 'yarn' is not supported"));
  bad = j;
  bad["use_sliding_window"] = true;
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("sliding-window"));
  bad = j;
  bad["num_key_value_heads"] = 3;
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("multiple of num_kv_heads"));
  bad = j;
  bad["hidden_size"] = "wide";
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("hidden_size: has the wrong type"));

  // Issue 50, item 10: sizes are checked before anything is allocated (these asked the
  // allocator for 256 TB), each naming the field; floats are not integers.
  bad = j;
  bad["num_hidden_layers"] = -1;
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("num_layers = -1 is not in [1, 1024]"));
  bad = j;
  bad["vocab_size"] = 1e12;
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("vocab_size: must be an integer"));
  bad["vocab_size"] = int64_t{1000000000000};
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("vocab_size = 1000000000000 is not in"));
  bad = j;
  bad["vocab_size"] = 1 << 24;
  bad["hidden_size"] = 1 << 17;
  bad["intermediate_size"] = 1 << 20;
  bad["num_hidden_layers"] = 1024;
  bad["head_dim"] = 64;
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("parameters") && Contains("more than"));
  bad = j;
  bad["rms_norm_eps"] = 0;
  CHECK_THROWS_WITH(rlx::model_config_from_hf(bad, "cfg"), Contains("rms_norm_eps"));
  // A shape that passes the bounds but cannot fit in this machine's memory: refused by
  // the constructor, before the allocator (2e11 float32 parameters, 800 GB).
  auto big = rlx::model_config_from_hf(j, "cfg");
  big.vocab_size = 1 << 20;
  big.hidden_size = 1 << 15;
  big.intermediate_size = 1 << 17;
  big.num_layers = 12;
  CHECK_THROWS_WITH(rlx::Transformer(big), Contains("more than this machine's"));
}

TEST_CASE("hf: save then load is bit-exact and gives the same logits", "[hf]") {
  TempDir dir;
  auto arch = GENERATE(rlx::Arch::llama, rlx::Arch::qwen2);
  auto c = rlx::model_preset("tiny", arch);
  c.tie_word_embeddings = arch == rlx::Arch::llama;
  rlx::Transformer m(c);
  m.init_weights(4);
  rlx::save_hf(m, dir.path);
  auto loaded = rlx::load_hf(dir.path);
  auto a = m.hf_parameters(), b = loaded->hf_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].first == b[i].first);
    CHECK(at::equal(a[i].second, b[i].second));
  }
  auto t = at::randint(c.vocab_size, {2, 7}, at::kLong);
  c10::NoGradGuard g;
  CHECK(at::equal(m.forward({.tokens = t}), loaded->forward({.tokens = t})));
  // HF names and the format metadata transformers requires.
  auto f = rlx::SafetensorsFile::open(dir / "model.safetensors");
  CHECK(f.header().metadata.at("format") == "pt");
  CHECK(f.find("model.layers.1.mlp.down_proj.weight") != nullptr);
  CHECK((f.find("lm_head.weight") != nullptr) == !c.tie_word_embeddings);
  CHECK((f.find("model.layers.0.self_attn.q_proj.bias") != nullptr) == (arch == rlx::Arch::qwen2));
  // Loading converts dtypes.
  auto bf = rlx::load_hf(dir.path, {.dtype = at::kBFloat16});
  CHECK(bf->hf_parameters()[0].second.scalar_type() == at::kBFloat16);
}

TEST_CASE("hf: sharded checkpoints with an index", "[hf]") {
  TempDir dir;
  rlx::Transformer m(rlx::model_preset("tiny"));
  m.init_weights(9);
  rlx::save_hf(m, dir.path, {.max_shard_bytes = 100'000});
  REQUIRE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  CHECK_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  auto index = json::parse(rlx::test::read_file(dir / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  CHECK(files.size() >= 3);
  auto loaded = rlx::load_hf(dir.path);
  auto a = m.hf_parameters(), b = loaded->hf_parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK(at::equal(a[i].second, b[i].second));
}

TEST_CASE("hf: missing, unexpected and mis-shaped tensors are named", "[hf]") {
  TempDir dir;
  auto c = rlx::model_preset("tiny");
  rlx::Transformer m(c);
  m.init_weights(1);
  rlx::save_hf(m, dir.path);
  auto params = m.hf_parameters();

  auto rewrite = [&](std::vector<std::pair<std::string, at::Tensor>> ts) {
    rlx::save_safetensors(dir / "model.safetensors", ts, {{"format", "pt"}});
  };
  auto missing = params;
  missing.erase(missing.begin() + 3);
  rewrite(missing);
  CHECK_THROWS_WITH(rlx::load_hf(dir.path), Contains("missing tensor '" + params[3].first + "'"));

  auto extra = params;
  extra.emplace_back("model.layers.9.mlp.up_proj.weight", at::zeros({2}));
  rewrite(extra);
  CHECK_THROWS_WITH(rlx::load_hf(dir.path), Contains("unexpected tensor 'model.layers.9.mlp.up_proj.weight'"));

  auto wrong = params;
  wrong[1].second = at::zeros({3, 3});
  rewrite(wrong);
  CHECK_THROWS_WITH(rlx::load_hf(dir.path), Contains("tensor '" + params[1].first + "' has shape [3, 3]"));

  std::filesystem::remove(dir / "model.safetensors");
  CHECK_THROWS_WITH(rlx::load_hf(dir.path), Contains("neither model.safetensors nor"));
}
