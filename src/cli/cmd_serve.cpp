// rlx serve --model DIR [--host H] [--port P] [--served-model-name NAME] [...]
//   An OpenAI-compatible HTTP server on the rollout engine (see rlx/serve/server.hpp).
//   Prints "rlx serve: listening on http://H:P/v1 (model NAME)" once it accepts requests,
//   and runs until SIGINT or SIGTERM.
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>

#include "commands.hpp"
#include "rlx/core/json.hpp"
#include "rlx/core/signals.hpp"
#include "rlx/core/threads.hpp"
#include "rlx/model/hf.hpp"
#include "rlx/serve/server.hpp"

namespace rlx::cli {
namespace {

std::atomic<bool> g_stop{false};

// The token ids that end an assistant turn: the chat template's eos_token and the model's
// generation_config.json eos_token_id(s), as transformers' generate stops on them.
std::vector<TokenId> end_of_turn_ids(const std::filesystem::path& dir, const Tokenizer& tok,
                                     const std::optional<chat::ChatTemplate>& tpl) {
  std::vector<TokenId> ids;
  auto add = [&](int64_t id) {
    if (id >= 0 && id < tok.vocab_size() && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(static_cast<TokenId>(id));
  };
  if (tpl && tpl->special_tokens().contains("eos_token"))
    if (auto id = tok.token_to_id(tpl->special_tokens()["eos_token"].get<std::string>())) add(*id);
  std::ifstream gen(dir / "generation_config.json");
  if (gen.good()) {
    try {
      auto j = parse_json(std::string(std::istreambuf_iterator<char>(gen), {}), (dir / "generation_config.json").string());
      auto eos = j.value("eos_token_id", nlohmann::json());
      if (eos.is_number_integer()) add(eos.get<int64_t>());
      else if (eos.is_array())
        for (const auto& e : eos)
          if (e.is_number_integer()) add(e.get<int64_t>());
    } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
      RLX_CHECK(false, "{}: {}", (dir / "generation_config.json").string(), e.what());
    }
  }
  return ids;
}

}  // namespace

void add_serve_command(CLI::App& app, Action& action) {
  struct Args {
    std::string model, name, tokenizer, dtype = "float32", device = "cpu", host = "127.0.0.1";
    int port = 8000, threads = 0;
    double kv_cache_mb = 256;
    int64_t max_batch_tokens = 2048, max_body_kb = 4096;
    serve::ServeLimits limits;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API with the rollout engine");
  cmd->add_option("--model", a->model, "HF model directory (its tokenizer.json and chat template are used)")->required();
  cmd->add_option("--served-model-name", a->name, "the model's name in requests (default: the directory's name)");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer file (default: the model directory's tokenizer.json)");
  cmd->add_option("--host", a->host, "address to listen on");
  cmd->add_option("--port", a->port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--dtype", a->dtype, "float32, bfloat16 or float16")->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  cmd->add_option("--device", a->device, "cpu or cuda[:N]");
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV-cache pool size in MiB");
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "tokens per forward pass")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--threads", a->threads, "compute threads (0: all cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--max-in-flight", a->limits.max_in_flight, "requests served at once; more are answered 429")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--max-body-kb", a->max_body_kb, "largest request body in KiB; larger is answered 413")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-n", a->limits.max_n, "largest 'n'")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--request-timeout-s", a->limits.request_timeout_s, "a request generating longer is aborted (504)")->check(CLI::PositiveNumber);
  cmd->add_option("--request-read-timeout-s", a->limits.request_read_timeout_s,
                  "a request's headers and body must arrive within this many seconds of its first byte (408)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-connections", a->limits.max_connections,
                  "open connections; more are answered 503 (0: 2 x --max-in-flight + 64)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  cmd->add_option("--max-connections-per-peer", a->limits.max_connections_per_peer,
                  "open connections from one client address; more are answered 429 (0: --max-in-flight + 32)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  cmd->callback([a, &action] {
    action = [a] {
      set_compute_threads(a->threads);
      const auto dtype = to_scalar_type(*config::enum_from_string<DType>(a->dtype));
      const std::filesystem::path dir(a->model);
      auto model = load_hf(dir, {.dtype = dtype, .device = at::Device(a->device)});
      std::shared_ptr<const Tokenizer> tok =
          load_tokenizer(a->tokenizer.empty() ? dir / "tokenizer.json" : std::filesystem::path(a->tokenizer));
      serve::ServedModel served;
      served.name = a->name.empty() ? std::filesystem::weakly_canonical(dir).filename().string() : a->name;
      served.tokenizer = tok;
      if (std::filesystem::exists(dir / "chat_template.jinja") || std::filesystem::exists(dir / "tokenizer_config.json")) {
        try {
          served.chat_template = chat::ChatTemplate::load(dir);
        } catch (const Error& e) {
          std::cerr << "rlx serve: no chat completions: " << e.what() << "\n";
        }
      }
      served.end_of_turn = end_of_turn_ids(dir, *tok, served.chat_template);
      Engine engine(model, {.kv_cache_mb = a->kv_cache_mb, .max_batch_tokens = a->max_batch_tokens}, tok);
      served.max_model_len = engine.max_model_len();
      a->limits.max_body_bytes = a->max_body_kb * 1024;
      serve::Server server(engine, served, {.host = a->host, .port = a->port, .limits = a->limits});
      on_stop_signals([](int) { g_stop = true; });
      server.start();
      std::cout << fmt::format("rlx serve: listening on http://{}:{}/v1 (model {}{})", a->host, server.port(), served.name,
                               served.chat_template ? "" : ", no chat template: completions only")
                << std::endl;
      while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::cout << "rlx serve: stopping" << std::endl;
      server.stop();
      return 0;
    };
  });
}

}  // namespace rlx::cli
