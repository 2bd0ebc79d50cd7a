// Number literals for the math expression reader (math_expr.hpp): 12, 3.5, .5, 2.5e-3,
// 0.1\overline{6} (a repeating decimal), and the fraction of whole numbers that makes a
// mixed number after a whole one (2\frac{1}{2}). Pure scanning over the text, no state.
//
//   auto n = math::read_number("0.1\\overline{6}+x", 0);  // n->value == 0.1666..., n->end == 15
//   auto f = math::read_whole_fraction(" \\frac{1}{2}", 0);  // f->value == 0.5, f->end == 12
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace rlx::env::math {

struct Scanned {
  double value = 0;
  size_t end = 0;     // the position after the literal
  bool whole = true;  // digits only: no point, exponent or repeating part
};

// The literal at `pos` (a digit or a '.'); nullopt for a lone '.'. A value past a double's
// range is infinity.
std::optional<Scanned> read_number(std::string_view s, size_t pos);

// `\frac{a}{b}`, `\dfrac{a}{b}`, `\tfrac ab` of whole numbers at `pos` (after spaces), as a / b.
std::optional<Scanned> read_whole_fraction(std::string_view s, size_t pos);

// Whether the LaTeX command `name` (without its backslash) is at `pos`, not followed by a letter.
bool command_at(std::string_view s, size_t pos, std::string_view name);

}  // namespace rlx::env::math
