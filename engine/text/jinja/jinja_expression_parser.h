#pragma once
// The expression half of the template parser: a cursor over the lexer's tokens and Jinja2's
// expression grammar (operator precedence, filters binding tighter than arithmetic, tests, calls,
// subscripts). jinja_parser.cpp parses the statements on top of it.
#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/jinja/jinja_ast.h"
#include "engine/text/jinja/jinja_lexer.h"

namespace kvchat::jinja {

class ExpressionParser {
 protected:
  explicit ExpressionParser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  // Names that end an expression list besides the tag's end ("in" of a for loop, ...).
  using EndTags = std::initializer_list<const char*>;

  // ---- token stream
  const Token& current() const { return tokens_[index_]; }
  const Token& look() const { return tokens_[std::min(index_ + 1, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& token = tokens_[index_];
    if (index_ + 1 < tokens_.size()) ++index_;
    return token;
  }
  static Position position(const Token& token) { return Position{token.line, token.column}; }
  bool is_op(const char* op) const { return current().type == TokenType::Operator && current().value == op; }
  bool is_name(const char* name) const { return current().type == TokenType::Name && current().value == name; }
  [[noreturn]] void fail(const Token& at, const std::string& message) const;
  static std::string token_text(const Token& token);
  bool skip_op(const char* op);
  bool skip_name(const char* name);
  const Token& expect_op(const char* op);
  const Token& expect_name();
  const Token& expect_name(const char* name);
  void expect(TokenType type);

  // ---- the expressions statements are made of
  ExprPtr parse_tuple(bool simplified, bool with_condexpr, EndTags extra_end, bool explicit_parentheses);
  ExprPtr parse_expression(bool with_condexpr);
  // `| name(args) | ...` applied to node; start_inline: the first name comes without its `|`
  // ({% filter upper|trim %}).
  ExprPtr parse_filters(ExprPtr node, bool start_inline = false);

  // Counts one level of recursion into a nested expression for its lifetime: past
  // kMaxExpressionDepth the parser fails instead of exhausting the stack.
  class Nesting {
   public:
    Nesting(ExpressionParser& parser, const Token& at);
    ~Nesting() { --parser_.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    ExpressionParser& parser_;
  };

 private:
  bool is_tuple_end(EndTags extra_end) const;
  // One function per precedence level, loosest first: x if c else y, or, and, not, comparisons,
  // + -, ~, * / // %, **, unary - +, then subscripts, calls, filters and tests.
  ExprPtr parse_condexpr();
  ExprPtr binary(const std::string& op, Position pos, ExprPtr left, ExprPtr right);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr literal(Position pos, Value value);
  ExprPtr parse_primary();
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& node);
  ExprPtr parse_call(ExprPtr callee);
  std::string dotted_name(const Token& first);
  ExprPtr parse_test(ExprPtr node);
  // Every node with children is returned through here: sets its depth and fails past
  // kMaxExpressionDepth, so chains built by loops (a ~ b ~ c ..., x.a.b.c ..., x|f|g ...) are bounded too.
  ExprPtr sealed(ExprPtr node) const;

  std::vector<Token> tokens_;
  std::size_t index_ = 0;
  int nesting_ = 0;
};

}  // namespace kvchat::jinja
