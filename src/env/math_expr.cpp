#include "env/math_expr.hpp"
#include "env/math_text.hpp"

#include <fmt/format.h>

#include <cctype>
#include <limits>
#include <numbers>
#include <optional>
#include <set>

#include "env/math_number.hpp"

namespace rlx::env::math {

namespace {

using Op = Expr::Op;
using Fn = Expr::Fn;

// Functions by the name they are written with, `\sin` or `sin`.
std::optional<Fn> function_named(std::string_view name) {
  static const std::pair<std::string_view, Fn> table[] = {
      {"sqrt", Fn::sqrt},   {"sin", Fn::sin},       {"cos", Fn::cos},       {"tan", Fn::tan},
      {"sec", Fn::sec},     {"csc", Fn::csc},       {"cot", Fn::cot},       {"arcsin", Fn::asin},
      {"arccos", Fn::acos}, {"arctan", Fn::atan},   {"ln", Fn::ln},         {"log", Fn::log10},
      {"lg", Fn::log10},    {"exp", Fn::exp},       {"abs", Fn::abs}};
  for (const auto& [n, f] : table)
    if (n == name) return f;
  return std::nullopt;
}

bool is_greek(const std::string& name) {
  static const std::set<std::string> greek = {
      "alpha", "beta",  "gamma",   "delta", "epsilon", "varepsilon", "zeta",  "eta",   "theta", "vartheta",
      "iota",  "kappa", "lambda",  "mu",    "nu",      "xi",         "rho",   "sigma", "tau",   "upsilon",
      "phi",   "varphi", "chi",    "psi",   "omega",   "Gamma",      "Delta", "Theta", "Lambda", "Xi",
      "Sigma", "Phi",   "Psi",     "Omega"};
  return greek.count(name) > 0;
}

}  // namespace

// Recursive descent, one function per precedence level:
//   sum := product (('+'|'-') product)*
//   product := signed (('*'|'/') signed | power)*      (a value right after another multiplies)
//   signed := ('-'|'+') signed | power
//   power := postfix ('^' exponent)?                   (right-associative)
//   postfix := primary ('!'|'%')*
//   primary := number | word | '(' sum ')' | '{' sum '}' | '[' sum ']' | '|' sum '|' | command
class Parser {
 public:
  Parser(std::string_view text, Budget& budget, Expr& out) : s_(text), b_(budget), out_(out) {}

  int32_t parse_all() {
    const int32_t root = sum();
    skip();
    if (p_ != s_.size()) fail(fmt::format("unexpected '{}'", s_[p_]));
    return root;
  }

 private:
  // Bounds the recursion: every level that can nest counts.
  struct Deeper {
    explicit Deeper(Parser& p) : p_(p) {
      if (++p_.depth_ > p_.b_.max_depth) throw CheckLimit(fmt::format("nesting deeper than {}", p_.b_.max_depth));
    }
    ~Deeper() { --p_.depth_; }
    Parser& p_;
  };

  [[noreturn]] void fail(const std::string& why) const { throw ParseFailure(fmt::format("{} at {}", why, p_)); }
  char peek() const { return p_ < s_.size() ? s_[p_] : '\0'; }
  void skip() {
    while (p_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[p_]))) ++p_;
  }
  void expect(char c) {
    skip();
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++p_;
  }
  bool at_command(std::string_view name) const { return command_at(s_, p_, name); }

  int32_t node(Expr::Node n) {
    b_.tick();
    if (out_.nodes_.size() >= b_.max_nodes) throw CheckLimit(fmt::format("more than {} nodes", b_.max_nodes));
    out_.nodes_.push_back(n);
    return static_cast<int32_t>(out_.nodes_.size() - 1);
  }
  int32_t num(double v) { return node({.op = Op::num, .value = v}); }
  int32_t bin(Op op, int32_t a, int32_t b) { return node({.op = op, .a = a, .b = b}); }
  int32_t func(Fn f, int32_t a) { return node({.op = Op::func, .fn = f, .a = a}); }
  int32_t variable(const std::string& name) {
    auto& vars = out_.variables_;
    size_t i = 0;
    while (i < vars.size() && vars[i] != name) ++i;
    if (i == vars.size()) vars.push_back(name);
    return node({.op = Op::var, .var = static_cast<int32_t>(i)});
  }

  int32_t sum() {
    Deeper d(*this);
    int32_t v = product();
    for (;;) {
      skip();
      if (peek() != '+' && peek() != '-') return v;
      const Op op = s_[p_++] == '+' ? Op::add : Op::sub;
      v = bin(op, v, product());
    }
  }

  int32_t product() {
    int32_t v = signed_value();
    for (;;) {
      skip();
      if (peek() == '*' || peek() == '/') {
        const Op op = s_[p_++] == '*' ? Op::mul : Op::div;
        v = bin(op, v, signed_value());
      } else if (starts_value()) {
        v = bin(Op::mul, v, power());
      } else {
        return v;
      }
    }
  }

  // Whether a value starts here (implicit multiplication: 2x, 3\pi, (a)(b)).
  bool starts_value() const {
    const char c = peek();
    if (is_digit(c) || c == '.' || is_letter(c) || c == '(' || c == '{') return true;
    if (c == '|') return abs_open_ == 0;
    return c == '\\' && !at_command("rfloor") && !at_command("rceil");
  }

  int32_t signed_value() {
    Deeper d(*this);
    skip();
    if (peek() == '-') {
      ++p_;
      return node({.op = Op::neg, .a = signed_value()});
    }
    if (peek() == '+') {
      ++p_;
      return signed_value();
    }
    return power();
  }

  int32_t power() {
    const int32_t base = postfix();
    skip();
    if (peek() != '^') return base;
    ++p_;
    return bin(Op::pow, base, exponent());
  }

  int32_t exponent() {
    Deeper d(*this);
    skip();
    if (peek() == '{') return group('}');
    if (peek() == '-') {
      ++p_;
      return node({.op = Op::neg, .a = exponent()});
    }
    if (peek() == '+') ++p_;
    return power();
  }

  int32_t postfix() {
    int32_t v = primary();
    for (;;) {
      skip();
      if (peek() == '!') {
        ++p_;
        v = node({.op = Op::fact, .a = v});
      } else if (peek() == '%') {
        ++p_;
        v = bin(Op::div, v, num(100));
      } else {
        return v;
      }
    }
  }

  int32_t primary() {
    Deeper d(*this);
    skip();
    const char c = peek();
    if (is_digit(c) || c == '.') return number();
    if (c == '(') return group(')');
    if (c == '{') return group('}');
    if (c == '[') return group(']');
    if (c == '|') {
      ++p_;
      const int saved = abs_open_;
      abs_open_ = 1;
      const int32_t v = sum();
      abs_open_ = saved;
      expect('|');
      return func(Fn::abs, v);
    }
    if (c == '\\') return command();
    if (is_letter(c)) return word();
    if (c == '\0') fail("the expression ends early");
    fail(fmt::format("unexpected '{}'", c));
  }

  int32_t group(char close) {
    ++p_;
    const int saved = abs_open_;
    abs_open_ = 0;
    const int32_t v = sum();
    abs_open_ = saved;
    expect(close);
    return v;
  }

  // A literal; a whole number right before a fraction of whole numbers is a mixed number:
  // `2\frac{1}{2}` is two and a half.
  int32_t number() {
    const auto n = read_number(s_, p_);
    if (!n) fail("a lone '.'");
    p_ = n->end;
    const int32_t v = num(n->value);
    if (!n->whole) return v;
    const auto f = read_whole_fraction(s_, p_);
    if (!f) return v;
    p_ = f->end;
    return bin(Op::add, v, num(f->value));
  }

  int32_t command() {
    Deeper d(*this);
    ++p_;  // the backslash
    const size_t start = p_;
    while (is_letter(peek())) ++p_;
    const std::string name(s_.substr(start, p_ - start));
    if (name.empty()) fail("a backslash without a command");
    if (name == "frac" || name == "dfrac" || name == "tfrac" || name == "cfrac") {
      const int32_t a = arg();
      return bin(Op::div, a, arg());
    }
    if (name == "binom" || name == "dbinom" || name == "tbinom") {
      const int32_t a = arg();
      return bin(Op::binom, a, arg());
    }
    if (name == "sqrt") {
      skip();
      const int32_t index = peek() == '[' ? group(']') : -1;
      const int32_t x = arg();
      return index < 0 ? func(Fn::sqrt, x) : bin(Op::root, x, index);
    }
    if (name == "pi") return num(std::numbers::pi);
    if (name == "infty") return num(std::numeric_limits<double>::infinity());
    if (name == "lfloor" || name == "lceil") {
      const int32_t v = sum();
      skip();
      const std::string close = name == "lfloor" ? "rfloor" : "rceil";
      if (!at_command(close)) fail("expected \\" + close);
      p_ += 1 + close.size();
      return func(name == "lfloor" ? Fn::floor : Fn::ceil, v);
    }
    if (auto f = function_named(name)) return function(*f);
    if (is_greek(name)) return variable("\\" + name);
    fail("unknown command \\" + name);
  }

  // A command's argument: a {group}, or one digit, letter or command (`\frac12`, `\sqrt x`).
  int32_t arg() {
    skip();
    const char c = peek();
    if (c == '{') return group('}');
    if (is_digit(c)) return num(s_[p_++] - '0');
    if (is_letter(c)) return variable(std::string(1, s_[p_++]));
    if (c == '\\') return command();
    fail("expected an argument");
  }

  // `\sin x`, `\sin(2x)`, `\sin^2 x` (the power of the value), `\log_2 8`; an argument
  // without brackets runs over digits and letters (`\sin 2x`), not over commands.
  int32_t function(Fn f) {
    skip();
    int32_t base = -1, power_of = -1;
    if (f == Fn::log10 && peek() == '_') {
      ++p_;
      base = arg();
      skip();
    }
    if (peek() == '^') {
      ++p_;
      power_of = exponent();
      skip();
    }
    int32_t x = -1;
    if (peek() == '(') {
      x = group(')');
    } else if (peek() == '{') {
      x = group('}');
    } else {
      x = power();
      while ((skip(), is_digit(peek()) || is_letter(peek()))) x = bin(Op::mul, x, power());
    }
    const int32_t v = base >= 0 ? bin(Op::log_base, x, base) : func(f, x);
    return power_of >= 0 ? bin(Op::pow, v, power_of) : v;
  }

  // Letters: a function's or constant's name, else a variable of one letter (`x_1`, `a_{n}`
  // carry their subscript); in `xy^2` the next letter is the next factor, so the power binds
  // to y alone. A word of three letters or more is not an expression.
  int32_t word() {
    const size_t start = p_;
    while (is_letter(peek())) ++p_;
    const std::string w(s_.substr(start, p_ - start));
    if (auto f = function_named(w)) return function(*f);
    if (w == "pi") return num(std::numbers::pi);
    if (w.size() > 2) fail(fmt::format("the word '{}'", w));
    p_ = start + 1;
    std::string name(1, w[0]);
    if (peek() == '_') name += "_" + subscript();
    return variable(name);
  }

  std::string subscript() {
    ++p_;  // '_'
    if (peek() != '{') {
      if (!is_digit(peek()) && !is_letter(peek())) fail("expected a subscript");
      return std::string(1, s_[p_++]);
    }
    const size_t close = s_.find('}', p_);
    if (close == std::string_view::npos) fail("a subscript's '{' is not closed");
    std::string sub;
    for (size_t i = p_ + 1; i < close; ++i)
      if (!std::isspace(static_cast<unsigned char>(s_[i]))) sub += s_[i];
    p_ = close + 1;
    return sub;
  }

  std::string_view s_;
  size_t p_ = 0;
  Budget& b_;
  Expr& out_;
  int depth_ = 0;
  int abs_open_ = 0;  // inside |...|: a '|' closes instead of multiplying
};

Expr Expr::parse(std::string_view text, Budget& budget) {
  if (text.size() > budget.max_chars) throw CheckLimit(fmt::format("longer than {} characters", budget.max_chars));
  Expr e;
  Parser p(text, budget, e);
  e.root_ = p.parse_all();
  return e;
}

}  // namespace rlx::env::math
