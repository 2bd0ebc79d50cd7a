// The algorithms that ship with rlx, registered through the public interface.
#include <mutex>

#include "rlx/algo/algorithm.hpp"

namespace rlx::algo {

void register_grpo();
void register_reinforce_pp();
void register_gspo();
void register_cispo();
void register_sft();
void register_ppo();
void register_distill();

void register_bundled_algorithms() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_grpo();
    register_reinforce_pp();
    register_gspo();
    register_cispo();
    register_sft();
    register_ppo();
    register_distill();
  });
}

}  // namespace rlx::algo
