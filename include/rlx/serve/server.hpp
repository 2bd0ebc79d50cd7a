// `rlx serve`: an OpenAI-compatible HTTP server on the rollout engine.
//
// POST /v1/chat/completions and /v1/completions (streaming, n, logprobs, stop, seed),
// GET /v1/models and /health. One thread runs the engine's steps (continuous batching
// across every request in flight); HTTP handler threads parse, queue and wait. Sizes,
// concurrency and time are bounded (ServeLimits); a bad request gets a 4xx with OpenAI's
// error object and harms nothing else.
//
//   rlx::serve::Server server(engine, served_model, {.port = 0});
//   server.start();                       // binds; server.port() is the port
//   ...
//   server.stop();
#pragma once

#include <memory>
#include <string>

#include "rlx/rollout/engine.hpp"
#include "rlx/serve/openai.hpp"

namespace rlx::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see Server::port)
  ServeLimits limits;
};

class Server {
 public:
  // `engine` is used only from the server's engine thread until stop() returns.
  Server(Engine& engine, ServedModel model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving on background threads. Throws rlx::Error when the address
  // cannot be bound.
  void start();
  int port() const;
  // Ends the requests in flight (503), stops listening and joins the threads.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlx::serve
