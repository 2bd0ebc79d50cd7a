// A trainer of your own: `rlx run`'s launcher, with your algorithms and environments.
//
// Every role of a run (hub, learner ranks, rollout workers, env servers) is a process of
// the binary that launched it, so a trainer registers its parts in main and hands the
// command line to trainer_main; the `rlx` binary is this main with the bundled parts.
//
//   int main(int argc, char** argv) {
//     return rlx::launch::trainer_main(argc, argv, "my_trainer", [] {
//       rlx::env::Registry::global().add("my_env", "what it does", make_my_env, my_tasks);
//       rlx::algo::register_algorithm("my_algo", make_my_algo);
//     });
//   }
//   $ ./my_trainer run my.yaml env.name=my_env algorithm.name=my_algo
//
// Commands: run, sft, eval, scale, k8s render (and the internal role, env serve).
// The bundled algorithms and environments are registered as well.
#pragma once

#include <functional>
#include <string>

namespace rlx::launch {

// `register_parts` runs first in every process (before the command line is read).
// Returns the exit code: 0 ok, 1 failure, 2 bad usage or config, 128 + signal when stopped.
int trainer_main(int argc, char** argv, const std::string& name = "trainer",
                 const std::function<void()>& register_parts = {});

}  // namespace rlx::launch
