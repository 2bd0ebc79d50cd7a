// The checker reads each side into an Answer (a set, a sequence with its brackets, an
// equation, an expression, or text) and compares the two structurally; expressions are
// compared by value at the same random points.
#include "rlx/env/math_verify.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "env/math_expr.hpp"
#include "env/math_text.hpp"
#include "rlx/core/rng.hpp"

namespace rlx::env::math {

namespace {

constexpr int kMaxNesting = 8;  // sets of tuples of ...

struct Answer {
  enum class Kind { expr, equation, sequence, set, text };
  Kind kind = Kind::text;
  std::string text;                  // the canonical text, without spaces
  std::optional<Expr> expr, lhs;     // expr: the value; equation: lhs = expr; `x = 3`: lhs x, expr 3
  std::vector<Answer> items;         // sequence, set
  char open = 0, close = 0;          // a sequence's brackets: (1, 2], [0, 1)
  bool percent = false;
  bool words = false;                // text that is words ("Monday"), not math that failed to read
  std::string failure;               // why text that is not words could not be read
};

std::string compact(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool is_words(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == ' ' || c == '\'' || c == '-';
  });
}

// A name that `name = value` assigns: x, x_1, y_{n}, \theta, f(x).
bool simple_name(std::string_view s) {
  if (s.size() >= 2 && s[0] == '\\') return std::all_of(s.begin() + 1, s.end(), [](char c) { return std::isalpha(c); });
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  s.remove_prefix(1);
  if (s.empty()) return true;
  if (s[0] == '_') return s.size() >= 2 && s.find_first_of("=+-*/ ") == std::string_view::npos;
  return s.size() == 3 && s[0] == '(' && std::isalpha(static_cast<unsigned char>(s[1])) && s[2] == ')';
}

// Whether the bracket at s[0] closes at the last character: (1, 2] yes, (1)(2) no.
bool encloses(std::string_view s) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(' || s[i] == '[' || s[i] == '{') ++depth;
    if ((s[i] == ')' || s[i] == ']' || s[i] == '}') && --depth == 0) return i + 1 == s.size();
  }
  return false;
}

// \{ ... \} around the whole text: \{1\} \cup \{2\} is not one set.
bool encloses_set(std::string_view s) {
  if (s.size() < 4 || s.rfind("\\{", 0) != 0 || s.compare(s.size() - 2, 2, "\\}") != 0) return false;
  int depth = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] != '\\') continue;
    if (s[i + 1] == '{') ++depth;
    if (s[i + 1] == '}' && --depth == 0) return i + 2 == s.size();
    ++i;
  }
  return false;
}

class Reader {
 public:
  explicit Reader(Budget& budget) : budget_(budget) {}

  // Each part is normalized again: "15 minutes, 30 seconds" has units in both items.
  Answer read(std::string_view text, int depth = 0) {
    if (depth > kMaxNesting) throw CheckLimit(fmt::format("answers nested deeper than {}", kMaxNesting));
    budget_.tick();
    const Normalized n = normalize_answer(text);
    Answer a = structure(n.text, depth);
    a.text = compact(n.text);
    a.percent = n.percent;
    return a;
  }

 private:
  Answer structure(const std::string& s, int depth) {
    if (auto in = split_top_level(s, "\\in"); in.size() == 2 && simple_name(in[0])) return read(in[1], depth + 1);
    if (encloses_set(s)) return set_of(split_top_level(std::string_view(s).substr(2, s.size() - 4), ","), depth);
    if (auto parts = split_top_level(s, "\\cup"); parts.size() > 1) return set_of(parts, depth);
    if (s.rfind("\\langle", 0) == 0 && s.size() > 13 && s.compare(s.size() - 7, 7, "\\rangle") == 0)
      return sequence(split_top_level(std::string_view(s).substr(7, s.size() - 14), ","), '(', ')', depth);
    for (std::string_view sep : {",", ";"})  // a bare list
      if (auto items = split_top_level(s, sep); items.size() > 1) return set_of(items, depth);
    if (auto sides = split_top_level(s, "="); sides.size() >= 2) return equation(sides, depth);
    if (s.size() >= 2 && (s[0] == '(' || s[0] == '[') && (s.back() == ')' || s.back() == ']') && encloses(s)) {
      auto items = split_top_level(std::string_view(s).substr(1, s.size() - 2), ",");
      if (items.size() >= 2) return sequence(items, s.front(), s.back(), depth);
    }
    for (std::string_view pm : {"\\pm", "\\mp"})
      if (auto parts = split_top_level(s, pm); parts.size() == 2)  // a \pm b: the set {a + b, a - b}
        return set_of({parts[0] + "+" + parts[1], parts[0] + "-" + parts[1]}, depth);
    return expression(s);
  }

  Answer set_of(const std::vector<std::string>& items, int depth) {
    Answer a;
    a.kind = Answer::Kind::set;
    for (const auto& item : items)
      if (!item.empty()) a.items.push_back(read(item, depth + 1));
    return a;
  }

  Answer sequence(const std::vector<std::string>& items, char open, char close, int depth) {
    Answer a;
    a.kind = Answer::Kind::sequence;
    a.open = open, a.close = close;
    for (const auto& item : items) a.items.push_back(read(item, depth + 1));
    return a;
  }

  // `x = 3` is the answer 3 (x kept as lhs for a comparison with an equation); `x = y = 3` is 3;
  // `2x + 3y = 6` is an equation.
  Answer equation(const std::vector<std::string>& sides, int depth) {
    const bool assigns = std::all_of(sides.begin(), sides.end() - 1, [](const std::string& x) { return simple_name(x); });
    if (assigns || sides.front().empty()) {
      Answer a = read(sides.back(), depth + 1);
      if (sides.size() == 2 && a.kind == Answer::Kind::expr && !sides.front().empty()) a.lhs = parse(sides.front());
      return a;
    }
    if (sides.size() != 2) return text(fmt::format("{}", fmt::join(sides, "=")), "more than one '='");
    Answer a;
    try {
      a.lhs = Expr::parse(sides[0], budget_);
      a.expr = Expr::parse(sides[1], budget_);
    } catch (const ParseFailure& e) {
      return text(sides[0] + "=" + sides[1], e.what());
    }
    a.kind = Answer::Kind::equation;
    return a;
  }

  std::optional<Expr> parse(const std::string& s) {
    try {
      return Expr::parse(s, budget_);
    } catch (const ParseFailure&) {
      return std::nullopt;
    }
  }

  Answer expression(const std::string& s) {
    try {
      Answer a;
      a.expr = Expr::parse(s, budget_);
      a.kind = Answer::Kind::expr;
      return a;
    } catch (const ParseFailure& e) {
      return text(s, e.what());
    }
  }

  static Answer text(const std::string& s, const std::string& why) {
    Answer a;
    a.words = is_words(s);
    if (!a.words) a.failure = fmt::format("cannot read {:?}: {}", s, why);
    return a;
  }

  Budget& budget_;
};

class Comparer {
 public:
  Comparer(Budget& budget, const VerifyOptions& o) : budget_(budget), o_(o) {}
  std::string detail;

  // `a` is the answer, `b` the reference.
  Verdict compare(const Answer& a, const Answer& b) {
    budget_.tick();
    using K = Answer::Kind;
    if (a.text == b.text && a.percent == b.percent && !a.text.empty()) return Verdict::equal;
    if (a.kind == K::text || b.kind == K::text) return compare_text(a, b);
    if (a.kind == K::set && a.items.size() == 1 && b.kind != K::set) return compare(a.items[0], b);
    if (b.kind == K::set && b.items.size() == 1 && a.kind != K::set) return compare(a, b.items[0]);
    if (a.kind == K::set && b.kind == K::set) return compare_sets(a, b);
    if (a.kind == K::sequence && b.kind == K::sequence) {
      if (a.open != b.open || a.close != b.close || a.items.size() != b.items.size()) return Verdict::different;
      Verdict v = Verdict::equal;
      for (size_t i = 0; i < a.items.size() && v != Verdict::different; ++i) v = worst(v, compare(a.items[i], b.items[i]));
      return v;
    }
    if (a.kind == K::expr && b.kind == K::expr) return compare_values(a, b);
    const Answer* eq_a = a.kind == K::equation || a.lhs ? &a : nullptr;
    const Answer* eq_b = b.kind == K::equation || b.lhs ? &b : nullptr;
    if (eq_a && eq_b && (a.kind == K::equation || b.kind == K::equation)) return compare_equations(*eq_a, *eq_b);
    return Verdict::different;
  }

 private:
  // different wins (a wrong part makes the whole wrong); then undecided; then equal.
  static Verdict worst(Verdict x, Verdict y) {
    for (Verdict v : {Verdict::different, Verdict::limit, Verdict::unparsed})
      if (x == v || y == v) return v;
    return Verdict::equal;
  }

  Verdict compare_text(const Answer& a, const Answer& b) {
    if (lowercase(a.text) == lowercase(b.text)) return Verdict::equal;
    for (const Answer* x : {&a, &b}) {
      if (x->kind == Answer::Kind::text && !x->words) {
        detail = (x == &a ? "answer: " : "reference: ") + x->failure;
        return Verdict::unparsed;
      }
    }
    return Verdict::different;
  }

  // Any order; each item of one matches a different item of the other.
  Verdict compare_sets(const Answer& a, const Answer& b) {
    if (a.items.size() != b.items.size()) return Verdict::different;
    std::vector<bool> used(b.items.size(), false);
    Verdict undecided = Verdict::different;
    for (const auto& x : a.items) {
      bool found = false;
      for (size_t j = 0; j < b.items.size() && !found; ++j) {
        if (used[j]) continue;
        const Verdict v = compare(x, b.items[j]);
        if (v == Verdict::equal) found = used[j] = true;
        if (v == Verdict::unparsed || v == Verdict::limit) undecided = v;
      }
      if (!found) return undecided;
    }
    return Verdict::equal;
  }

  static bool close(double x, double y, double rel) {
    if (std::isinf(x) || std::isinf(y)) return x == y;
    return std::fabs(x - y) <= rel * std::max(std::fabs(x), std::fabs(y)) + 1e-12;
  }

  // Both sides' values at the same points: one point without variables; else up to
  // `points` points where both are defined (variables uniform in [0.5, 2.5]).
  template <class F, class G>
  std::vector<std::pair<double, double>> sample(const std::vector<std::string>& vars, F fa, G fb) {
    std::vector<std::pair<double, double>> out;
    RngStream rng(0x6d617468);  // the same points for every check: a verdict is reproducible
    const int tries = vars.empty() ? 1 : 4 * o_.points;
    std::map<std::string, double> values;
    for (int t = 0; t < tries && static_cast<int>(out.size()) < (vars.empty() ? 1 : o_.points); ++t) {
      for (const auto& v : vars) values[v] = 0.5 + 2 * rng.uniform();
      const double x = fa(values), y = fb(values);
      if (!std::isnan(x) && !std::isnan(y)) out.emplace_back(x, y);
    }
    return out;
  }

  static std::vector<std::string> variables(std::initializer_list<const Expr*> exprs) {
    std::vector<std::string> out;
    for (const Expr* e : exprs)
      for (const auto& v : e->variables())
        if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    return out;
  }

  Verdict compare_values(const Answer& a, const Answer& b) {
    const auto vars = variables({&*a.expr, &*b.expr});
    auto fa = [&](const std::map<std::string, double>& v) { return a.expr->eval(v, budget_); };
    auto fb = [&](const std::map<std::string, double>& v) { return b.expr->eval(v, budget_); };
    const auto points = sample(vars, fa, fb);
    if (points.empty() || (!vars.empty() && points.size() < 2)) return undefined(fb, vars);
    // 50% against 0.5 or 50: a percent on one side may be read either way.
    std::vector<std::pair<double, double>> scales = {{1, 1}};
    if (a.percent != b.percent) scales.emplace_back(a.percent ? 0.01 : 1, b.percent ? 0.01 : 1);
    for (const auto& [sa, sb] : scales)
      if (std::all_of(points.begin(), points.end(),
                      [&](const auto& p) { return close(sa * p.first, sb * p.second, o_.rel_tol); }))
        return Verdict::equal;
    return Verdict::different;
  }

  // No point where both are real numbers: a reference without a value cannot be checked;
  // an answer without one (1/0) is wrong.
  template <class G>
  Verdict undefined(G reference, const std::vector<std::string>& vars) {
    const auto ref = sample(vars, [](const auto&) { return 0.0; }, reference);
    if (ref.empty() || (!vars.empty() && ref.size() < 2)) {
      detail = "the reference has no real value";
      return Verdict::unparsed;
    }
    return Verdict::different;
  }

  // lhs - rhs of one is a constant non-zero multiple of the other's: 2x + 2y = 2 is x + y = 1.
  Verdict compare_equations(const Answer& a, const Answer& b) {
    const auto vars = variables({&*a.lhs, &*a.expr, &*b.lhs, &*b.expr});
    auto fa = [&](const auto& v) { return a.lhs->eval(v, budget_) - a.expr->eval(v, budget_); };
    auto fb = [&](const auto& v) { return b.lhs->eval(v, budget_) - b.expr->eval(v, budget_); };
    const auto points = sample(vars, fa, fb);
    if (points.empty() || (points.size() < 2 && !vars.empty())) return undefined(fb, vars);
    std::optional<double> ratio;
    for (const auto& [x, y] : points) {
      if (!ratio && std::fabs(y) > 1e-9) ratio = x / y;
      if (ratio && !close(x, *ratio * y, o_.rel_tol)) return Verdict::different;
      if (!ratio && std::fabs(x) > 1e-9) return Verdict::different;
    }
    return ratio && *ratio == 0 ? Verdict::different : Verdict::equal;
  }

  Budget& budget_;
  const VerifyOptions& o_;
};

}  // namespace

Check check_equal(std::string_view answer, std::string_view reference, const VerifyOptions& options) {
  Budget budget{.deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(options.time_limit_s)),
                .max_chars = options.max_chars,
                .max_nodes = options.max_nodes};
  try {
    if (answer.size() > options.max_chars || reference.size() > options.max_chars)
      return {Verdict::limit, fmt::format("an answer longer than {} characters", options.max_chars)};
    Reader reader(budget);
    const Answer a = reader.read(answer), b = reader.read(reference);
    Comparer comparer(budget, options);
    const Verdict v = comparer.compare(a, b);
    return {v, v == Verdict::equal || v == Verdict::different ? std::string() : comparer.detail};
  } catch (const CheckLimit& e) {
    return {Verdict::limit, e.what()};
  } catch (const std::exception& e) {  // a bug in the checker: counted, never a crash
    return {Verdict::unparsed, fmt::format("checker error: {}", e.what())};
  }
}

}  // namespace rlx::env::math
