// The token-recording gateway's endpoint: an OpenAI chat-completions API on a unix socket,
// for one agent program at a time. A sandboxed program (no network) reaches it through the
// socket's directory, bound into its sandbox; its requests are handed to the caller one by
// one (next()), who answers each (reply()) with what the policy sampled. The caller (the
// `agent_program` environment) records the tokens; the program only ever sees text.
//
//   rlx::serve::Gateway gw("/tmp/rlx-agent-1/gateway.sock");
//   auto call = gw.next(30, [&] { return program_exited; });   // the program's request body
//   gw.reply(200, completion_json);
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

namespace rlx::serve {

struct GatewayOptions {
  int64_t max_body_bytes = 4 << 20;  // a larger request is answered 413
  double reply_timeout_s = 600;      // a request not answered in this time gets a 504
};

class Gateway {
 public:
  // Listens on `socket_path` (created; its directory must exist). Throws rlx::Error when it
  // cannot.
  explicit Gateway(std::filesystem::path socket_path, GatewayOptions options = {});
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // The next chat-completions request's body, waiting up to `timeout_s`; nullopt when
  // `give_up` returns true (checked every 20 ms) or the time is up. Requests the gateway
  // answers itself (GET /v1/models, malformed JSON, other paths) never come here.
  std::optional<nlohmann::ordered_json> next(double timeout_s, const std::function<bool()>& give_up);
  // Answers the request next() returned last.
  void reply(int status, const nlohmann::ordered_json& body);
  // Answers a pending request (if any) with 503 and drops queued ones: a new episode.
  void reset();
  const std::filesystem::path& socket_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlx::serve
