// A small math expression reader for the answer checker (math_verify.hpp): LaTeX and plain
// text (`\frac{1}{2}`, `\frac12`, `2\sqrt[3]{x}`, `\sin^2 x`, `3x^2 - |y|`, `2.5e-3`,
// `2\frac{1}{2}` as a mixed number) parsed by recursive descent into a tree held in an
// arena, then evaluated in double precision with values for its variables. Every parse
// and evaluation runs under a Budget: input size, node count, nesting depth and a deadline.
//
//   math::Budget budget{.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100)};
//   math::Expr e = math::Expr::parse("\\frac{x^2}{2} + \\pi", budget);
//   double v = e.eval({{"x", 2.0}}, budget);  // 2 + 3.14159...
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::env::math {

// The text is not an expression this reader knows (a word, an unknown command, a stray
// bracket). The checker counts it; it is never a crash.
class ParseFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bound of the check was reached (size, nodes, depth, time).
class CheckLimit : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Budget {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  size_t max_chars = 1000;  // longest text parsed
  size_t max_nodes = 1000;  // nodes of one expression's tree
  int max_depth = 96;       // nesting of groups, signs, commands and exponents (about 3 per bracket level)
  uint32_t ticks = 0;       // units of work so far
  // Counts one unit of work; throws CheckLimit once past the deadline (read every 64 units).
  void tick() {
    if ((++ticks & 63) == 0 && std::chrono::steady_clock::now() > deadline) throw CheckLimit("the time bound");
  }
};

class Expr {
 public:
  // Throws ParseFailure for text that is not an expression, CheckLimit past a bound.
  static Expr parse(std::string_view text, Budget& budget);

  // The value with `values` for the variables (by name, e.g. "x", "x_1", "\\theta"); a
  // variable without a value is NaN. NaN also for a value outside a function's domain.
  double eval(const std::map<std::string, double>& values, Budget& budget) const;
  const std::vector<std::string>& variables() const { return variables_; }

  enum class Op : uint8_t { num, var, neg, add, sub, mul, div, pow, fact, root, log_base, binom, func };
  enum class Fn : uint8_t { sqrt, sin, cos, tan, sec, csc, cot, asin, acos, atan, ln, log10, exp, abs, floor, ceil };
  struct Node {
    Op op = Op::num;
    Fn fn = Fn::sqrt;
    int32_t a = -1, b = -1;  // operands (root: radicand, index; log_base: argument, base)
    double value = 0;        // num
    int32_t var = -1;        // var: index in variables_
  };

 private:
  friend class Parser;
  double eval_node(int32_t n, const std::vector<double>& vars, Budget& budget) const;
  std::vector<Node> nodes_;
  std::vector<std::string> variables_;
  int32_t root_ = -1;
};

}  // namespace rlx::env::math
