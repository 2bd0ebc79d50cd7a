// The `env:` section of a run config: which environment, its options, how many turns,
// whether it runs in env servers, and the sandbox's limits.
//
//   env:
//     name: python_code
//     options: {digits: "3"}        # the environment's own options (values: JSON or text)
//     max_turns: 1
//     servers: 2                    # env server processes per rollout worker (0: in-process)
//     sandbox: {limits: {wall_s: 5, memory_mb: 512}}
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "rlx/core/config.hpp"
#include "rlx/env/sandbox.hpp"

namespace rlx::env {

struct EnvOptions {
  std::string name = "arithmetic";
  std::map<std::string, std::string> options;  // the environment's own options
  int max_turns = 1;
  uint32_t servers = 0;        // env server processes per rollout worker (0: in the worker)
  double timeout_s = 30;       // per call to an env server
  uint32_t retries = 3;        // per call, after the first try
  uint32_t max_restarts = 5;   // per env server
  SandboxOptions sandbox;

  template <class V>
  void visit(V& v) {
    v("name", name, "environment, by registered name (`rlx env list`)");
    v("options", options, "the environment's own options; each value is read as JSON when it parses, else as text");
    v("max_turns", max_turns, "actions per episode at most", config::in_range(1, 100000));
    v("servers", servers, "env server processes per rollout worker, each sandboxed (0: environments run in the worker)",
      config::in_range(0, 1024));
    v("timeout_s", timeout_s, "timeout of one call to an env server", config::seconds());
    v("retries", retries, "retries of a call to an env server (restarting it if it died) before an infra error",
      config::in_range(0, 100));
    v("max_restarts", max_restarts, "restarts of one env server before the run fails", config::in_range(0, 1000));
    v("sandbox", sandbox, "the sandbox of env servers and of code the environments run");
  }

  // `options` as the JSON object environments receive (Context::options).
  nlohmann::json options_json() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [key, text] : options) {
      auto value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      j[key] = value.is_discarded() ? nlohmann::json(text) : value;
    }
    return j;
  }
};

}  // namespace rlx::env
