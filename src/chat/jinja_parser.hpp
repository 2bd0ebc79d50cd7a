// The Jinja engine's parser, internal to src/chat: the tokens of jinja_lexer.cpp become the
// syntax tree of jinja_ast.hpp, with Jinja2's grammar and operator precedence. One Parser
// holds the cursor, the errors and the bounds; its members are defined in two files, by
// concern: jinja_parse.cpp the template's block structure and its statements ({% if %},
// {% for %}, {% set %}, {% macro %}, ...), jinja_parse_expr.cpp the expressions (operator
// precedence, literals, subscripts, calls, filters and tests). The two recurse into each other
// (a statement holds expressions; `{% filter %}` takes an expression's filter chain).
//
//   Parser parser(lex(source, name), source, name, limits);
//   std::unique_ptr<Block> tree = parser.run();
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_ast.hpp"
#include "chat/jinja_lexer.hpp"

namespace rlx::chat::jinja::detail {

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string_view source, const std::string& name, const ParseLimits& limits)
      : t_(std::move(tokens)), source_(source), name_(name), limits_(limits) {}

  std::unique_ptr<Block> run() {
    auto block = make<Block>();
    std::string end;
    *block = parse_until({}, &end);
    return block;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::text:
        return "text";
      case Tok::var_begin:
        return "'{{'";
      case Tok::var_end:
        return "'}}'";
      case Tok::block_begin:
        return "'{%'";
      case Tok::block_end:
        return "'%}'";
      case Tok::eof:
        return "the end of the template";
      case Tok::string:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw TemplateError(fmt::format("{}:{}: {}", name_, cur().line, what));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::name) fail(fmt::format("expected a name, got {}", describe(cur())));
    return t_[i_++].text;
  }
  void expect_block_end(const char* tag) {
    if (cur().type != Tok::block_end) fail(fmt::format("expected '%}}' to end '{}', got {}", tag, describe(cur())));
    ++i_;
  }
  template <class N>
  std::unique_ptr<N> make(int line = 0) {
    if (++nodes_ > limits_.max_nodes)
      limit_failed("max_nodes", fmt::format("the template has more than {} syntax-tree nodes", limits_.max_nodes));
    auto n = std::make_unique<N>();
    n->line = line > 0 ? line : cur().line;
    return n;
  }

  // ---- bounds
  [[noreturn]] void limit_failed(const char* limit, const std::string& what) const {
    size_t pos = std::min(cur().pos, source_.size());
    size_t line_start = source_.rfind('\n', pos == 0 ? 0 : pos - 1);
    size_t column = line_start == std::string_view::npos || pos == 0 ? pos + 1 : pos - line_start;
    throw LimitError(fmt::format("{}:{}: {} at column {} (ParseLimits::{})", name_, cur().line, what, column, limit),
                     limit);
  }
  // One level of the parser's recursion (a block, a bracket, a `not` or a sign) while in scope.
  class Nested {
   public:
    Nested(Parser& p, int& depth, const char* what) : depth_(depth) {
      if (++depth_ > p.limits_.max_depth)
        p.limit_failed("max_depth", fmt::format("{} nest deeper than {} levels", what, p.limits_.max_depth));
    }
    ~Nested() { --depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    int& depth_;
  };
  // `n`'s height from its children's, checked: a left-associative chain grows its tree one
  // level per link without any recursion in the parser.
  void grow(Expr& n, const Expr* child);
  void grow(Expr& n, const CallArgs& args);

  // ---- statements (jinja_parse.cpp)
  // Statements up to a block tag named in `ends` (which is consumed; its name goes to
  // *end), or to the end of the template when `ends` is empty.
  Block parse_until(std::initializer_list<const char*> ends, std::string* end);
  NodePtr parse_statement();
  NodePtr parse_if();
  std::vector<std::string> parse_targets();
  NodePtr parse_for();
  NodePtr parse_set();
  NodePtr parse_macro();
  NodePtr parse_filter_block();

  // ---- expressions, lowest precedence first (jinja_parse_expr.cpp)
  ExprPtr parse_tuple(bool with_condexpr = true);
  ExprPtr parse_expression();
  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr object);
  CallArgs parse_call_args();
  ExprPtr parse_call(ExprPtr callee);
  std::unique_ptr<FilterExpr> parse_filter(ExprPtr operand);
  ExprPtr parse_filter_expr(ExprPtr e);

  std::vector<Token> t_;
  size_t i_ = 0;
  std::string_view source_;
  const std::string& name_;
  const ParseLimits& limits_;
  int loop_depth_ = 0;
  int block_depth_ = 0, expr_depth_ = 0;  // the parser's recursion: blocks, and brackets and prefixes
  size_t nodes_ = 0;
};

}  // namespace rlx::chat::jinja::detail
