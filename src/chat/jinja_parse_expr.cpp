// The Jinja engine's parser, the expressions' side: Jinja2's operators by recursive descent (a
// function per precedence level, lowest first), literals, attributes, subscripts and slices,
// calls, and filter and test applications. A chain of 10,000 `+` is an error
// (ParseLimits::max_depth) caught by the tree's height as it grows, since a left-associative
// chain is parsed in a loop, not by recursion.
#include <fmt/format.h>

#include <algorithm>

#include "chat/jinja_parser.hpp"

namespace rlx::chat::jinja::detail {

void Parser::grow(Expr& n, const Expr* child) {
  if (child) n.height = std::max(n.height, child->height + 1);
  if (n.height > limits_.max_depth)
    limit_failed("max_depth", fmt::format("an expression nests deeper than {} levels", limits_.max_depth));
}

void Parser::grow(Expr& n, const CallArgs& args) {
  for (const auto& e : args.positional) grow(n, e.get());
  for (const auto& [k, e] : args.keywords) grow(n, e.get());
}

ExprPtr Parser::parse_tuple(bool with_condexpr) {
  int line = cur().line;
  ExprPtr first = with_condexpr ? parse_expression() : parse_or();
  if (!is_op(",")) return first;
  auto list = make<ListExpr>(line);
  list->tuple = true;
  grow(*list, first.get());
  list->items.push_back(std::move(first));
  while (skip_op(",")) {
    if (cur().type == Tok::var_end || cur().type == Tok::block_end || is_op(")") || is_name("if")) break;
    list->items.push_back(with_condexpr ? parse_expression() : parse_or());
    grow(*list, list->items.back().get());
  }
  return list;
}

ExprPtr Parser::parse_expression() {
  Nested nested(*this, expr_depth_, "expressions");
  ExprPtr e = parse_or();
  while (is_name("if")) {
    auto n = make<Conditional>();
    ++i_;
    n->then = std::move(e);
    n->cond = parse_or();
    if (skip_name("else")) n->otherwise = parse_expression();
    grow(*n, n->then.get());
    grow(*n, n->cond.get());
    grow(*n, n->otherwise.get());
    e = std::move(n);
  }
  return e;
}

ExprPtr Parser::binary(std::string op, ExprPtr l, ExprPtr r, int line) {
  auto n = make<Binary>(line);
  n->op = std::move(op);
  grow(*n, l.get());
  grow(*n, r.get());
  n->left = std::move(l);
  n->right = std::move(r);
  return n;
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (is_name("or")) {
    int line = cur().line;
    ++i_;
    e = binary("or", std::move(e), parse_and(), line);
  }
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (is_name("and")) {
    int line = cur().line;
    ++i_;
    e = binary("and", std::move(e), parse_not(), line);
  }
  return e;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    Nested nested(*this, expr_depth_, "expressions");
    auto n = make<Unary>();
    ++i_;
    n->op = '!';
    n->operand = parse_not();
    grow(*n, n->operand.get());
    return n;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  int line = cur().line;
  ExprPtr e = parse_math1();
  std::unique_ptr<Compare> cmp;
  while (true) {
    std::string op;
    if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                  cur().text == ">" || cur().text == ">=")) {
      op = cur().text;
      ++i_;
    } else if (is_name("in")) {
      op = "in";
      ++i_;
    } else if (is_name("not") && peek().type == Tok::name && peek().text == "in") {
      op = "notin";
      i_ += 2;
    } else {
      break;
    }
    if (!cmp) {
      cmp = make<Compare>(line);
      grow(*cmp, e.get());
      cmp->first = std::move(e);
    }
    cmp->rest.emplace_back(op, parse_math1());
    grow(*cmp, cmp->rest.back().second.get());
  }
  if (cmp) return cmp;
  return e;
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    std::string op = cur().text;
    int line = cur().line;
    ++i_;
    e = binary(op, std::move(e), parse_concat(), line);
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  ExprPtr e = parse_math2();
  while (is_op("~")) {
    int line = cur().line;
    ++i_;
    e = binary("~", std::move(e), parse_math2(), line);
  }
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = cur().text;
    int line = cur().line;
    ++i_;
    e = binary(op, std::move(e), parse_pow(), line);
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (is_op("**")) {
    int line = cur().line;
    ++i_;
    e = binary("**", std::move(e), parse_unary(true), line);
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    Nested nested(*this, expr_depth_, "expressions");
    auto n = make<Unary>();
    n->op = cur().text[0];
    ++i_;
    n->operand = parse_unary(false);
    grow(*n, n->operand.get());
    e = std::move(n);
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  if (t.type == Tok::name) {
    auto lit = make<Literal>();
    if (t.text == "true" || t.text == "True")
      lit->value = Value(true);
    else if (t.text == "false" || t.text == "False")
      lit->value = Value(false);
    else if (t.text == "none" || t.text == "None")
      lit->value = Value::none();
    else {
      auto n = make<Name>();
      n->name = t.text;
      ++i_;
      return n;
    }
    ++i_;
    return lit;
  }
  if (t.type == Tok::string) {
    auto lit = make<Literal>();
    std::string s;
    while (cur().type == Tok::string) s += t_[i_++].text;  // adjacent strings concatenate
    lit->value = Value(std::move(s));
    return lit;
  }
  if (t.type == Tok::integer || t.type == Tok::floating) {
    auto lit = make<Literal>();
    try {
      lit->value = t.type == Tok::integer ? Value(static_cast<int64_t>(std::stoll(t.text))) : Value(std::stod(t.text));
    } catch (const std::exception&) {
      fail(fmt::format("the number {} is out of range", t.text));
    }
    ++i_;
    return lit;
  }
  if (is_op("(")) {
    ++i_;
    if (skip_op(")")) {  // ()
      auto empty = make<ListExpr>();
      empty->tuple = true;
      return empty;
    }
    ExprPtr e = parse_tuple();
    expect_op(")");
    return e;
  }
  if (is_op("[")) {
    auto n = make<ListExpr>();
    ++i_;
    while (!is_op("]")) {
      n->items.push_back(parse_expression());
      grow(*n, n->items.back().get());
      if (!skip_op(",")) break;
    }
    expect_op("]");
    return n;
  }
  if (is_op("{")) {
    auto n = make<DictExpr>();
    ++i_;
    while (!is_op("}")) {
      ExprPtr k = parse_expression();
      expect_op(":");
      n->items.emplace_back(std::move(k), parse_expression());
      grow(*n, n->items.back().first.get());
      grow(*n, n->items.back().second.get());
      if (!skip_op(",")) break;
    }
    expect_op("}");
    return n;
  }
  fail(fmt::format("unexpected {}", describe(t)));
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    if (is_op(".")) {
      ++i_;
      if (cur().type == Tok::integer) {
        auto n = make<GetItem>();
        grow(*n, e.get());
        n->object = std::move(e);
        auto lit = make<Literal>();
        try {
          lit->value = Value(static_cast<int64_t>(std::stoll(cur().text)));
        } catch (const std::exception&) {
          fail(fmt::format("the number {} is out of range", cur().text));
        }
        ++i_;
        n->index = std::move(lit);
        e = std::move(n);
        continue;
      }
      auto n = make<GetAttr>();
      grow(*n, e.get());
      n->object = std::move(e);
      n->attr = expect_name();
      e = std::move(n);
    } else if (is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr object) {
  int line = cur().line;
  expect_op("[");
  ExprPtr parts[3];
  int colons = 0;
  while (!is_op("]")) {
    if (skip_op(":")) {
      if (++colons > 2) fail("a slice has at most two ':'");
      continue;
    }
    if (parts[colons]) fail(fmt::format("expected ']' or ':', got {}", describe(cur())));
    parts[colons] = parse_expression();
  }
  expect_op("]");
  if (colons == 0) {
    if (!parts[0]) fail("an empty subscript");
    auto n = make<GetItem>(line);
    grow(*n, object.get());
    grow(*n, parts[0].get());
    n->object = std::move(object);
    n->index = std::move(parts[0]);
    return n;
  }
  auto n = make<Slice>(line);
  for (const Expr* child : {object.get(), parts[0].get(), parts[1].get(), parts[2].get()}) grow(*n, child);
  n->object = std::move(object);
  n->start = std::move(parts[0]);
  n->stop = std::move(parts[1]);
  n->step = std::move(parts[2]);
  return n;
}

CallArgs Parser::parse_call_args() {
  CallArgs args;
  expect_op("(");
  while (!is_op(")")) {
    if (is_op("*") || is_op("**")) fail("'*' and '**' arguments are not supported");
    if (cur().type == Tok::name && peek().type == Tok::op && peek().text == "=") {
      std::string key = t_[i_].text;
      i_ += 2;
      args.keywords.emplace_back(std::move(key), parse_expression());
    } else {
      if (!args.keywords.empty()) fail("a positional argument follows a keyword argument");
      args.positional.push_back(parse_expression());
    }
    if (!skip_op(",")) break;
  }
  expect_op(")");
  return args;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto n = make<Call>();
  n->callee = std::move(callee);
  n->args = parse_call_args();
  grow(*n, n->callee.get());
  grow(*n, n->args);
  return n;
}

std::unique_ptr<FilterExpr> Parser::parse_filter(ExprPtr operand) {
  auto n = make<FilterExpr>();
  n->operand = std::move(operand);
  n->filter = expect_name();
  if (!has_filter(n->filter)) {
    --i_;
    fail(fmt::format("no filter named '{}'", n->filter));
  }
  if (is_op("(")) n->args = parse_call_args();
  grow(*n, n->operand.get());
  grow(*n, n->args);
  return n;
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  while (true) {
    if (skip_op("|")) {
      e = parse_filter(std::move(e));
    } else if (is_name("is")) {
      auto n = make<TestExpr>();
      ++i_;
      n->operand = std::move(e);
      n->negated = skip_name("not");
      n->test = expect_name();
      if (!has_test(n->test)) {
        --i_;
        fail(fmt::format("no test named '{}'", n->test));
      }
      if (is_op("(")) {
        n->args = parse_call_args();
      } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                  cur().type == Tok::floating || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if")) {
        if (is_name("is")) fail("tests cannot be chained with 'is'");
        n->args.positional.push_back(parse_postfix(parse_primary()));
      }
      grow(*n, n->operand.get());
      grow(*n, n->args);
      e = std::move(n);
    } else if (is_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

}  // namespace rlx::chat::jinja::detail
