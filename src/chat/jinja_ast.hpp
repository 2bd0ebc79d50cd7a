// The Jinja engine's syntax tree: what the parser (src/chat/jinja_parser.hpp) builds and
// src/chat/jinja_render_expr.cpp (expressions) and jinja_render.cpp (statements) evaluate.
// Every node keeps its template line for errors; the parser bounds the tree's height
// (ParseLimits), so that evaluating and destroying it recurse a bounded number of levels.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "rlx/chat/jinja.hpp"

namespace rlx::chat::jinja::detail {

class Renderer;

struct Expr {
  int line = 0;
  int height = 1;  // levels of the subtree: 1 for a leaf
  virtual ~Expr() = default;
  // Counts a step and a level of the renderer's depth, then evaluates.
  Value eval(Renderer& r) const;

 protected:
  virtual Value evaluate(Renderer& r) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  int line = 0;
  virtual ~Node() = default;
  virtual void exec(Renderer& r, std::string& out) const = 0;
};
using NodePtr = std::unique_ptr<Node>;

struct CallArgs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

// ---- expressions
struct Literal : Expr {
  Value value;
  Value evaluate(Renderer& r) const override;
};
struct Name : Expr {
  std::string name;
  Value evaluate(Renderer& r) const override;
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value evaluate(Renderer& r) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value evaluate(Renderer& r) const override;
};
struct GetAttr : Expr {
  ExprPtr object;
  std::string attr;
  Value evaluate(Renderer& r) const override;
};
struct GetItem : Expr {
  ExprPtr object, index;
  Value evaluate(Renderer& r) const override;
};
struct Slice : Expr {
  ExprPtr object, start, stop, step;  // each may be null
  Value evaluate(Renderer& r) const override;
};
struct Call : Expr {
  ExprPtr callee;
  CallArgs args;
  Value evaluate(Renderer& r) const override;
};
struct FilterExpr : Expr {
  ExprPtr operand;  // null inside a `{% filter %}` block's chain
  std::string filter;
  CallArgs args;
  Value evaluate(Renderer& r) const override;
};
struct TestExpr : Expr {
  ExprPtr operand;
  std::string test;
  CallArgs args;
  bool negated = false;
  Value evaluate(Renderer& r) const override;
};
struct Unary : Expr {
  char op = '-';  // '-', '+', '!' (not)
  ExprPtr operand;
  Value evaluate(Renderer& r) const override;
};
struct Binary : Expr {
  std::string op;  // + - * / // % ** ~ and or
  ExprPtr left, right;
  Value evaluate(Renderer& r) const override;
};
struct Compare : Expr {  // a < b <= c: Python's chained comparison
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // == != < <= > >= in notin
  Value evaluate(Renderer& r) const override;
};
struct Conditional : Expr {
  ExprPtr then, cond, otherwise;  // otherwise may be null: undefined
  Value evaluate(Renderer& r) const override;
};

// ---- statements
struct Text : Node {
  std::string text;
  void exec(Renderer& r, std::string& out) const override;
};
struct Output : Node {
  ExprPtr expr;
  void exec(Renderer& r, std::string& out) const override;
};
struct Block : Node {
  std::vector<NodePtr> body;
  void exec(Renderer& r, std::string& out) const override;
};
struct If : Node {
  std::vector<std::pair<ExprPtr, Block>> branches;
  Block otherwise;
  void exec(Renderer& r, std::string& out) const override;
};
struct For : Node {
  std::vector<std::string> targets;  // one name, or several unpacked from each item
  ExprPtr iterable, filter;           // filter may be null
  Block body, otherwise;
  void exec(Renderer& r, std::string& out) const override;
};
struct Set : Node {
  std::vector<std::string> targets;  // names; or one with `attr` set: `ns.attr = ...`
  std::string attr;
  ExprPtr value;
  void exec(Renderer& r, std::string& out) const override;
};
struct SetBlock : Node {
  std::string target;
  Block body;
  void exec(Renderer& r, std::string& out) const override;
};
struct Macro : Node {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Block body;
  void exec(Renderer& r, std::string& out) const override;
};
struct FilterBlock : Node {
  std::vector<std::unique_ptr<FilterExpr>> chain;
  Block body;
  void exec(Renderer& r, std::string& out) const override;
};
struct LoopControl : Node {
  bool is_break = true;
  void exec(Renderer& r, std::string& out) const override;
};

// Names the parser checks filters and tests against, so that an unknown one is an error at
// its line before anything renders.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

std::unique_ptr<Block> parse_template(std::string_view source, const std::string& name, const ParseLimits& limits);

}  // namespace rlx::chat::jinja::detail
