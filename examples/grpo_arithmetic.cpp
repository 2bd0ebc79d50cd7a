// The GRPO arithmetic example as a trainer binary: rlx's launcher with the bundled parts.
//   ./grpo_arithmetic sft examples/configs/sft_arithmetic.yaml        (warm start)
//   ./grpo_arithmetic run examples/configs/grpo_arithmetic.yaml model.path=runs/sft_arithmetic/final
#include "rlx/launch/main.hpp"

int main(int argc, char** argv) { return rlx::launch::trainer_main(argc, argv, "grpo_arithmetic"); }
