// The environments that ship with rlx (envs/), registered by name:
//   arithmetic    verifiable sums and products (digits, terms, operators)
//   countdown     reach a target with the given numbers and + - * /
//   calculator    multi-turn tool use: <calc>EXPR</calc> is answered with <result>V</result>
//   python_code   write a function; hidden tests run with python3 in the sandbox
//   guess_number  long horizon: find a hidden number from higher/lower answers
//   math          dataset problems (GSM8K, MATH) checked by an answer verifier (math_verify.hpp)
// They use only public headers, as a user's environment would.
#pragma once

#include "rlx/env/env.hpp"

namespace rlx::env {

// Adds every bundled environment not yet in `registry` (safe to call more than once).
void register_bundled(Registry& registry = Registry::global());

}  // namespace rlx::env
