// Evaluation of a parsed expression (math_expr.hpp) in double precision: NaN outside a
// function's domain (ln of a negative, 1/0, a factorial of a fraction), never an exception.
#include <cmath>
#include <limits>

#include "env/math_expr.hpp"

namespace rlx::env::math {

namespace {
using Op = Expr::Op;
using Fn = Expr::Fn;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

double Expr::eval(const std::map<std::string, double>& values, Budget& budget) const {
  std::vector<double> vars(variables_.size(), kNaN);
  for (size_t i = 0; i < variables_.size(); ++i)
    if (auto it = values.find(variables_[i]); it != values.end()) vars[i] = it->second;
  return eval_node(root_, vars, budget);
}

namespace {

bool whole(double x) { return std::isfinite(x) && x == std::floor(x); }

double apply(Fn f, double x) {
  switch (f) {
    case Fn::sqrt: return std::sqrt(x);
    case Fn::sin: return std::sin(x);
    case Fn::cos: return std::cos(x);
    case Fn::tan: return std::tan(x);
    case Fn::sec: return 1 / std::cos(x);
    case Fn::csc: return 1 / std::sin(x);
    case Fn::cot: return std::cos(x) / std::sin(x);
    case Fn::asin: return std::asin(x);
    case Fn::acos: return std::acos(x);
    case Fn::atan: return std::atan(x);
    case Fn::ln: return x > 0 ? std::log(x) : kNaN;
    case Fn::log10: return x > 0 ? std::log10(x) : kNaN;
    case Fn::exp: return std::exp(x);
    case Fn::abs: return std::fabs(x);
    case Fn::floor: return std::floor(x);
    case Fn::ceil: return std::ceil(x);
  }
  return kNaN;
}

double binomial(double n, double k) {
  if (!whole(n) || !whole(k) || k < 0 || n < 0 || k > n) return kNaN;
  return std::round(std::exp(std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1)));
}

}  // namespace

double Expr::eval_node(int32_t n, const std::vector<double>& vars, Budget& budget) const {
  budget.tick();
  const Node& x = nodes_[static_cast<size_t>(n)];
  switch (x.op) {
    case Op::num: return x.value;
    case Op::var: return vars[static_cast<size_t>(x.var)];
    case Op::neg: return -eval_node(x.a, vars, budget);
    case Op::func: return apply(x.fn, eval_node(x.a, vars, budget));
    case Op::fact: {
      const double a = eval_node(x.a, vars, budget);
      return whole(a) && a >= 0 && a <= 170 ? std::tgamma(a + 1) : kNaN;
    }
    default: break;
  }
  const double a = eval_node(x.a, vars, budget), b = eval_node(x.b, vars, budget);
  switch (x.op) {
    case Op::add: return a + b;
    case Op::sub: return a - b;
    case Op::mul: return a * b;
    case Op::div: return b == 0 ? kNaN : a / b;
    case Op::pow: return std::pow(a, b);
    case Op::root: return a < 0 && whole(b) && std::fmod(b, 2) != 0 ? -std::pow(-a, 1 / b) : std::pow(a, 1 / b);
    case Op::log_base: return a > 0 && b > 0 && b != 1 ? std::log(a) / std::log(b) : kNaN;
    case Op::binom: return binomial(a, b);
    default: return kNaN;
  }
}


}  // namespace rlx::env::math
