#include "engine/text/jinja/jinja_expression_parser.h"

#include "engine/text/jinja/jinja_builtins.h"
#include "engine/text/jinja/jinja_error.h"
#include "engine/text/jinja/jinja_limits.h"

#include <cstdlib>

namespace kvchat::jinja {

// ---- token stream

void ExpressionParser::fail(const Token& at, const std::string& message) const {
  throw TemplateError(std::to_string(at.line) + ":" + std::to_string(at.column) + ": " + message);
}

std::string ExpressionParser::token_text(const Token& token) {
  switch (token.type) {
    case TokenType::Name:
    case TokenType::Operator:
    case TokenType::Integer:
    case TokenType::Float: return "'" + token.value + "'";
    case TokenType::String: return "string literal";
    default: return describe(token.type);
  }
}

bool ExpressionParser::skip_op(const char* op) {
  if (!is_op(op)) return false;
  next();
  return true;
}

bool ExpressionParser::skip_name(const char* name) {
  if (!is_name(name)) return false;
  next();
  return true;
}

const Token& ExpressionParser::expect_op(const char* op) {
  if (!is_op(op)) fail(current(), std::string("expected '") + op + "', got " + token_text(current()));
  return next();
}

const Token& ExpressionParser::expect_name() {
  if (current().type != TokenType::Name) fail(current(), "expected a name, got " + token_text(current()));
  return next();
}

const Token& ExpressionParser::expect_name(const char* name) {
  if (!is_name(name)) fail(current(), std::string("expected '") + name + "', got " + token_text(current()));
  return next();
}

void ExpressionParser::expect(TokenType type) {
  if (current().type != type)
    fail(current(), std::string("expected ") + describe(type) + ", got " + token_text(current()));
  next();
}

// ---- depth

namespace {

std::string too_deep_message() {
  return "expression nested too deeply (more than " + std::to_string(kMaxExpressionDepth) +
         " levels of brackets, operators, filters or attribute lookups)";
}

}  // namespace

ExpressionParser::Nesting::Nesting(ExpressionParser& parser, const Token& at) : parser_(parser) {
  if (parser_.nesting_ >= kMaxExpressionDepth) parser_.fail(at, too_deep_message());
  ++parser_.nesting_;
}

ExprPtr ExpressionParser::sealed(ExprPtr node) const {
  int deepest = 0;
  auto visit = [&deepest](const ExprPtr& child) {
    if (child) deepest = std::max(deepest, child->depth);
  };
  visit(node->object);
  for (const ExprPtr& item : node->items) visit(item);
  for (const auto& keyword : node->keywords) visit(keyword.second);
  node->depth = deepest + 1;
  if (node->depth > kMaxExpressionDepth)
    throw TemplateError(std::to_string(node->pos.line) + ":" + std::to_string(node->pos.column) + ": " +
                        too_deep_message());
  return node;
}

// ---- expressions

bool ExpressionParser::is_tuple_end(EndTags extra_end) const {
  const Token& token = current();
  if (token.type == TokenType::VarEnd || token.type == TokenType::BlockEnd) return true;
  if (token.type == TokenType::Operator && token.value == ")") return true;
  for (const char* name : extra_end)
    if (is_name(name)) return true;
  return false;
}

ExprPtr ExpressionParser::parse_tuple(bool simplified, bool with_condexpr, EndTags extra_end,
                                      bool explicit_parentheses) {
  Position pos = position(current());
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
    if (is_op(","))
      is_tuple = true;
    else
      break;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses) fail(current(), "expected an expression, got " + token_text(current()));
  }
  auto tuple = std::make_unique<Expr>();
  tuple->kind = Expr::Kind::Tuple;
  tuple->pos = pos;
  tuple->items = std::move(items);
  return sealed(std::move(tuple));
}

ExprPtr ExpressionParser::parse_expression(bool with_condexpr) {
  Nesting nesting(*this, current());
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr ExpressionParser::parse_condexpr() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    Position pos = position(next());
    ExprPtr condition = parse_or();
    ExprPtr otherwise;
    if (skip_name("else")) {
      Nesting nesting(*this, current());
      otherwise = parse_condexpr();
    }
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::CondExpr;
    node->pos = pos;
    node->items.push_back(std::move(expr));
    node->items.push_back(std::move(condition));
    node->items.push_back(std::move(otherwise));
    expr = sealed(std::move(node));
  }
  return expr;
}

ExprPtr ExpressionParser::binary(const std::string& op, Position pos, ExprPtr left, ExprPtr right) {
  auto node = std::make_unique<Expr>();
  node->kind = Expr::Kind::Binary;
  node->pos = pos;
  node->name = op;
  node->object = std::move(left);
  node->items.push_back(std::move(right));
  return sealed(std::move(node));
}

ExprPtr ExpressionParser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    Position pos = position(next());
    left = binary("or", pos, std::move(left), parse_and());
  }
  return left;
}

ExprPtr ExpressionParser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    Position pos = position(next());
    left = binary("and", pos, std::move(left), parse_not());
  }
  return left;
}

ExprPtr ExpressionParser::parse_not() {
  if (is_name("not")) {
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::Unary;
    node->pos = position(next());
    node->name = "not";
    Nesting nesting(*this, current());
    node->object = parse_not();
    return sealed(std::move(node));
  }
  return parse_compare();
}

ExprPtr ExpressionParser::parse_compare() {
  Position pos = position(current());
  ExprPtr expr = parse_math1();
  auto node = std::make_unique<Expr>();
  node->kind = Expr::Kind::Compare;
  node->pos = pos;
  while (true) {
    const Token& token = current();
    if (token.type == TokenType::Operator && (token.value == "==" || token.value == "!=" || token.value == "<" ||
                                              token.value == "<=" || token.value == ">" || token.value == ">=")) {
      node->ops.push_back(next().value);
    } else if (is_name("in")) {
      next();
      node->ops.push_back("in");
    } else if (is_name("not") && look().type == TokenType::Name && look().value == "in") {
      next();
      next();
      node->ops.push_back("not in");
    } else {
      break;
    }
    node->items.push_back(parse_math1());
  }
  if (node->ops.empty()) return expr;
  node->object = std::move(expr);
  return sealed(std::move(node));
}

ExprPtr ExpressionParser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& op = next();
    left = binary(op.value, position(op), std::move(left), parse_concat());
  }
  return left;
}

ExprPtr ExpressionParser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    const Token& op = next();
    left = binary("~", position(op), std::move(left), parse_math2());
  }
  return left;
}

ExprPtr ExpressionParser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& op = next();
    left = binary(op.value, position(op), std::move(left), parse_pow());
  }
  return left;
}

ExprPtr ExpressionParser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const Token& op = next();
    left = binary("**", position(op), std::move(left), parse_unary(true));
  }
  return left;
}

ExprPtr ExpressionParser::parse_unary(bool with_filter) {
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const Token& op = next();
    node = std::make_unique<Expr>();
    node->kind = Expr::Kind::Unary;
    node->pos = position(op);
    node->name = op.value;
    Nesting nesting(*this, current());
    node->object = parse_unary(false);
    node = sealed(std::move(node));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr ExpressionParser::literal(Position pos, Value value) {
  auto node = std::make_unique<Expr>();
  node->kind = Expr::Kind::Literal;
  node->pos = pos;
  node->literal = std::move(value);
  return node;
}

ExprPtr ExpressionParser::parse_primary() {
  const Token& token = current();
  Position pos = position(token);
  switch (token.type) {
    case TokenType::Name: {
      next();
      const std::string& name = token.value;
      if (name == "true" || name == "True") return literal(pos, Value::from_bool(true));
      if (name == "false" || name == "False") return literal(pos, Value::from_bool(false));
      if (name == "none" || name == "None") return literal(pos, Value::none());
      auto node = std::make_unique<Expr>();
      node->kind = Expr::Kind::Name;
      node->pos = pos;
      node->name = name;
      return node;
    }
    case TokenType::String: {
      std::string text;
      while (current().type == TokenType::String) text += next().value;  // "a" "b" concatenates
      return literal(pos, Value::from_string(std::move(text)));
    }
    case TokenType::Integer: next(); return literal(pos, Value::from_int(std::stoll(token.value)));
    case TokenType::Float:
      next();
      // As Python's float(): past the range of a double is inf, below it 0.0 (std::stod would throw).
      return literal(pos, Value::from_float(std::strtod(token.value.c_str(), nullptr)));
    case TokenType::Operator:
      if (token.value == "(") {
        next();
        ExprPtr inner = parse_tuple(false, true, {}, true);
        expect_op(")");
        return inner;
      }
      if (token.value == "[") return parse_list();
      if (token.value == "{") return parse_dict();
      break;
    default: break;
  }
  fail(token, "unexpected " + token_text(token));
}

ExprPtr ExpressionParser::parse_list() {
  auto node = std::make_unique<Expr>();
  node->kind = Expr::Kind::List;
  node->pos = position(expect_op("["));
  while (!is_op("]")) {
    if (!node->items.empty()) expect_op(",");
    if (is_op("]")) break;
    node->items.push_back(parse_expression(true));
  }
  expect_op("]");
  return sealed(std::move(node));
}

ExprPtr ExpressionParser::parse_dict() {
  auto node = std::make_unique<Expr>();
  node->kind = Expr::Kind::Dict;
  node->pos = position(expect_op("{"));
  while (!is_op("}")) {
    if (!node->items.empty()) expect_op(",");
    if (is_op("}")) break;
    node->items.push_back(parse_expression(true));
    expect_op(":");
    node->items.push_back(parse_expression(true));
  }
  expect_op("}");
  return sealed(std::move(node));
}

ExprPtr ExpressionParser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr ExpressionParser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      node = parse_filters(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr ExpressionParser::parse_subscript(ExprPtr node) {
  const Token& token = next();
  auto result = std::make_unique<Expr>();
  result->pos = position(token);
  result->object = std::move(node);
  if (token.value == ".") {
    const Token& attribute = next();
    if (attribute.type == TokenType::Name) {
      result->kind = Expr::Kind::Getattr;
      result->name = attribute.value;
      return sealed(std::move(result));
    }
    if (attribute.type != TokenType::Integer) fail(attribute, "expected name or number after '.'");
    result->kind = Expr::Kind::Getitem;
    result->items.push_back(literal(position(attribute), Value::from_int(std::stoll(attribute.value))));
    return sealed(std::move(result));
  }
  result->kind = Expr::Kind::Getitem;
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  expect_op("]");
  if (args.size() == 1) {
    result->items.push_back(std::move(args[0]));
  } else {
    auto tuple = std::make_unique<Expr>();
    tuple->kind = Expr::Kind::Tuple;
    tuple->pos = result->pos;
    tuple->items = std::move(args);
    result->items.push_back(sealed(std::move(tuple)));
  }
  return sealed(std::move(result));
}

ExprPtr ExpressionParser::parse_subscribed() {
  Position pos = position(current());
  std::vector<ExprPtr> parts;
  if (is_op(":")) {
    next();
    parts.push_back(nullptr);
  } else {
    ExprPtr expr = parse_expression(true);
    if (!is_op(":")) return expr;
    next();
    parts.push_back(std::move(expr));
  }
  if (is_op(":")) {
    parts.push_back(nullptr);
  } else if (!is_op("]") && !is_op(",")) {
    parts.push_back(parse_expression(true));
  } else {
    parts.push_back(nullptr);
  }
  if (is_op(":")) {
    next();
    parts.push_back(!is_op("]") && !is_op(",") ? parse_expression(true) : nullptr);
  } else {
    parts.push_back(nullptr);
  }
  auto slice = std::make_unique<Expr>();
  slice->kind = Expr::Kind::Slice;
  slice->pos = pos;
  slice->items = std::move(parts);
  return sealed(std::move(slice));
}

void ExpressionParser::parse_call_args(Expr& node) {
  expect_op("(");
  bool require_comma = false;
  while (!is_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) fail(current(), "*args and **kwargs in calls are not supported");
    if (current().type == TokenType::Name && look().type == TokenType::Operator && look().value == "=") {
      std::string key = next().value;
      next();
      node.keywords.emplace_back(key, parse_expression(true));
    } else {
      if (!node.keywords.empty()) fail(current(), "positional argument after a keyword argument");
      node.items.push_back(parse_expression(true));
    }
    require_comma = true;
  }
  expect_op(")");
}

ExprPtr ExpressionParser::parse_call(ExprPtr callee) {
  auto node = std::make_unique<Expr>();
  node->kind = Expr::Kind::Call;
  node->pos = position(current());
  node->object = std::move(callee);
  parse_call_args(*node);
  return sealed(std::move(node));
}

std::string ExpressionParser::dotted_name(const Token& first) {
  std::string name = first.value;
  while (is_op(".")) {
    next();
    name += "." + expect_name().value;
  }
  return name;
}

ExprPtr ExpressionParser::parse_filters(ExprPtr node, bool start_inline) {
  while (start_inline || is_op("|")) {
    if (!start_inline) next();
    start_inline = false;
    const Token& token = expect_name();
    std::string name = dotted_name(token);
    Support support = filter_support(name);
    if (support == Support::Unknown) fail(token, "no filter named '" + name + "'");
    if (support == Support::KnownUnsupported) fail(token, "the filter '" + name + "' is not supported");
    auto filter = std::make_unique<Expr>();
    filter->kind = Expr::Kind::Filter;
    filter->pos = position(token);
    filter->name = name;
    filter->object = std::move(node);
    if (is_op("(")) parse_call_args(*filter);
    node = sealed(std::move(filter));
  }
  return node;
}

ExprPtr ExpressionParser::parse_test(ExprPtr node) {
  next();  // "is"
  bool negated = skip_name("not");
  const Token& token = expect_name();
  std::string name = dotted_name(token);
  Support support = test_support(name);
  if (support == Support::Unknown) fail(token, "no test named '" + name + "'");
  if (support == Support::KnownUnsupported) fail(token, "the test '" + name + "' is not supported");
  auto test = std::make_unique<Expr>();
  test->kind = Expr::Kind::Test;
  test->pos = position(token);
  test->name = name;
  test->negated = negated;
  test->object = std::move(node);
  const Token& after = current();
  if (is_op("(")) {
    parse_call_args(*test);
  } else if ((after.type == TokenType::Name || after.type == TokenType::String || after.type == TokenType::Integer ||
              after.type == TokenType::Float || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    // `x is divisibleby 3`: one argument without parentheses.
    if (is_name("is")) fail(after, "you cannot chain multiple tests with 'is'");
    test->items.push_back(parse_postfix(parse_primary()));
  }
  return sealed(std::move(test));
}

}  // namespace kvchat::jinja
