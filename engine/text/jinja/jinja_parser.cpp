#include "engine/text/jinja/jinja_parser.h"

#include <initializer_list>

#include "engine/text/jinja/jinja_builtins.h"
#include "engine/text/jinja/jinja_error.h"
#include "engine/text/jinja/jinja_lexer.h"

namespace kvchat::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (current().type != TokenType::Eof) fail(current(), "unexpected " + token_text(current()));
    return body;
  }

 private:
  // ---- token stream
  const Token& current() const { return tokens_[index_]; }
  const Token& look() const { return tokens_[std::min(index_ + 1, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& token = tokens_[index_];
    if (index_ + 1 < tokens_.size()) ++index_;
    return token;
  }
  static Position position(const Token& token) { return Position{token.line, token.column}; }

  [[noreturn]] void fail(const Token& at, const std::string& message) const {
    throw TemplateError(std::to_string(at.line) + ":" + std::to_string(at.column) + ": " + message);
  }

  static std::string token_text(const Token& token) {
    switch (token.type) {
      case TokenType::Name:
      case TokenType::Operator:
      case TokenType::Integer:
      case TokenType::Float: return "'" + token.value + "'";
      case TokenType::String: return "string literal";
      default: return describe(token.type);
    }
  }

  bool is_op(const char* op) const { return current().type == TokenType::Operator && current().value == op; }
  bool is_name(const char* name) const { return current().type == TokenType::Name && current().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  const Token& expect_op(const char* op) {
    if (!is_op(op)) fail(current(), std::string("expected '") + op + "', got " + token_text(current()));
    return next();
  }
  const Token& expect_name() {
    if (current().type != TokenType::Name) fail(current(), "expected a name, got " + token_text(current()));
    return next();
  }
  const Token& expect_name(const char* name) {
    if (!is_name(name)) fail(current(), std::string("expected '") + name + "', got " + token_text(current()));
    return next();
  }
  void expect(TokenType type) {
    if (current().type != type)
      fail(current(), std::string("expected ") + describe(type) + ", got " + token_text(current()));
    next();
  }

  // ---- statements
  using EndTags = std::initializer_list<const char*>;

  bool at_end_tag(EndTags end_tags) const {
    for (const char* tag : end_tags)
      if (is_name(tag)) return true;
    return false;
  }

  Body subparse(EndTags end_tags) {
    Body body;
    while (true) {
      const Token& token = current();
      if (token.type == TokenType::Data) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::Text;
        stmt->pos = position(token);
        stmt->text = token.value;
        body.push_back(std::move(stmt));
        next();
      } else if (token.type == TokenType::VarBegin) {
        next();
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::Output;
        stmt->pos = position(current());
        stmt->expr = parse_tuple(false, true, {}, false);
        expect(TokenType::VarEnd);
        body.push_back(std::move(stmt));
      } else if (token.type == TokenType::BlockBegin) {
        next();
        if (end_tags.size() && at_end_tag(end_tags)) return body;
        body.push_back(parse_statement());
        expect(TokenType::BlockEnd);
      } else if (token.type == TokenType::Eof) {
        return body;
      } else {
        fail(token, "unexpected " + token_text(token));
      }
    }
  }

  // Jinja2's parse_statements: the tag's block end, the body, and a check for a missing end tag.
  Body parse_statements(EndTags end_tags, bool drop_needle, const Token& opening) {
    expect(TokenType::BlockEnd);
    Body body = subparse(end_tags);
    if (current().type == TokenType::Eof) {
      std::string wanted;
      for (const char* tag : end_tags) wanted += std::string(wanted.empty() ? "'" : " or '") + tag + "'";
      fail(opening, "unexpected end of template: the '" + opening.value + "' tag opened here needs " + wanted);
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& token = current();
    if (token.type != TokenType::Name) fail(token, "tag name expected, got " + token_text(token));
    const std::string& tag = token.value;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(token, "'" + tag + "' outside of a for loop");
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      stmt->pos = position(token);
      next();
      return stmt;
    }
    static const char* const kKnownUnsupported[] = {"macro", "call",    "filter", "block",   "extends",
                                                    "include", "import", "from",  "with",    "autoescape",
                                                    "print",   "do",     "trans", "pluralize"};
    for (const char* known : kKnownUnsupported)
      if (tag == known) fail(token, "the '" + tag + "' tag is not supported");
    fail(token, "unknown tag '" + tag + "'");
  }

  StmtPtr parse_if() {
    const Token& opening = next();
    auto result = std::make_unique<Stmt>();
    result->kind = Stmt::Kind::If;
    result->pos = position(opening);
    while (true) {
      ExprPtr condition = parse_tuple(false, false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false, opening);
      result->branches.emplace_back(std::move(condition), std::move(body));
      const Token& tag = next();
      if (tag.value == "elif") continue;
      if (tag.value == "else") result->else_body = parse_statements({"endif"}, true, opening);
      break;
    }
    return result;
  }

  StmtPtr parse_for() {
    const Token& opening = next();
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = Stmt::Kind::For;
    stmt->pos = position(opening);
    stmt->target = parse_assign_target(false, {"in"});
    expect_name("in");
    stmt->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) stmt->filter = parse_expression(true);
    if (is_name("recursive")) fail(current(), "recursive for loops are not supported");
    ++loop_depth_;
    stmt->body = parse_statements({"endfor", "else"}, false, opening);
    --loop_depth_;
    if (next().value == "else") stmt->else_body = parse_statements({"endfor"}, true, opening);
    return stmt;
  }

  StmtPtr parse_set() {
    const Token& opening = next();
    auto stmt = std::make_unique<Stmt>();
    stmt->pos = position(opening);
    stmt->target = parse_assign_target(true, {});
    if (skip_op("=")) {
      stmt->kind = Stmt::Kind::Set;
      stmt->expr = parse_tuple(false, true, {}, false);
      return stmt;
    }
    stmt->kind = Stmt::Kind::SetBlock;
    if (is_op("|")) {
      auto placeholder = std::make_unique<Expr>();
      placeholder->kind = Expr::Kind::Name;
      placeholder->name = "";  // the rendered block body
      placeholder->pos = position(current());
      stmt->filter = parse_filters(std::move(placeholder));
    }
    stmt->body = parse_statements({"endset"}, true, opening);
    return stmt;
  }

  AssignTarget parse_assign_target(bool with_namespace, EndTags extra_end) {
    AssignTarget target;
    const Token& first = current();
    if (with_namespace && first.type == TokenType::Name && look().type == TokenType::Operator &&
        look().value == ".") {
      target.names.push_back(next().value);
      next();
      target.namespace_attribute = expect_name().value;
      return target;
    }
    ExprPtr expr = parse_tuple(true, true, extra_end, false);
    if (expr->kind == Expr::Kind::Name) {
      target.names.push_back(expr->name);
      return target;
    }
    if (expr->kind == Expr::Kind::Tuple) {
      target.is_tuple = true;
      for (const auto& item : expr->items) {
        if (item->kind != Expr::Kind::Name) fail(first, "can only assign to names or tuples of names");
        target.names.push_back(item->name);
      }
      return target;
    }
    fail(first, "can only assign to names or tuples of names");
  }

  // ---- expressions
  bool is_tuple_end(EndTags extra_end) const {
    const Token& token = current();
    if (token.type == TokenType::VarEnd || token.type == TokenType::BlockEnd) return true;
    if (token.type == TokenType::Operator && token.value == ")") return true;
    for (const char* name : extra_end)
      if (is_name(name)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, EndTags extra_end, bool explicit_parentheses) {
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
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      Position pos = position(next());
      ExprPtr condition = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) otherwise = parse_condexpr();
      auto node = std::make_unique<Expr>();
      node->kind = Expr::Kind::CondExpr;
      node->pos = pos;
      node->items.push_back(std::move(expr));
      node->items.push_back(std::move(condition));
      node->items.push_back(std::move(otherwise));
      expr = std::move(node);
    }
    return expr;
  }

  ExprPtr binary(const std::string& op, Position pos, ExprPtr left, ExprPtr right) {
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::Binary;
    node->pos = pos;
    node->name = op;
    node->object = std::move(left);
    node->items.push_back(std::move(right));
    return node;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      Position pos = position(next());
      left = binary("or", pos, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      Position pos = position(next());
      left = binary("and", pos, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto node = std::make_unique<Expr>();
      node->kind = Expr::Kind::Unary;
      node->pos = position(next());
      node->name = "not";
      node->object = parse_not();
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    Position pos = position(current());
    ExprPtr expr = parse_math1();
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::Compare;
    node->pos = pos;
    while (true) {
      const Token& token = current();
      if (token.type == TokenType::Operator &&
          (token.value == "==" || token.value == "!=" || token.value == "<" || token.value == "<=" ||
           token.value == ">" || token.value == ">=")) {
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
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      left = binary(op.value, position(op), std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& op = next();
      left = binary("~", position(op), std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      left = binary(op.value, position(op), std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& op = next();
      left = binary("**", position(op), std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      node = std::make_unique<Expr>();
      node->kind = Expr::Kind::Unary;
      node->pos = position(op);
      node->name = op.value;
      node->object = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr literal(Position pos, Value value) {
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::Literal;
    node->pos = pos;
    node->literal = std::move(value);
    return node;
  }

  ExprPtr parse_primary() {
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
      case TokenType::Integer:
        next();
        return literal(pos, Value::from_int(std::stoll(token.value)));
      case TokenType::Float:
        next();
        return literal(pos, Value::from_float(std::stod(token.value)));
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
      default:
        break;
    }
    fail(token, "unexpected " + token_text(token));
  }

  ExprPtr parse_list() {
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::List;
    node->pos = position(expect_op("["));
    while (!is_op("]")) {
      if (!node->items.empty()) expect_op(",");
      if (is_op("]")) break;
      node->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return node;
  }

  ExprPtr parse_dict() {
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
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_filter_expr(ExprPtr node) {
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

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& token = next();
    auto result = std::make_unique<Expr>();
    result->pos = position(token);
    result->object = std::move(node);
    if (token.value == ".") {
      const Token& attribute = next();
      if (attribute.type == TokenType::Name) {
        result->kind = Expr::Kind::Getattr;
        result->name = attribute.value;
        return result;
      }
      if (attribute.type != TokenType::Integer) fail(attribute, "expected name or number after '.'");
      result->kind = Expr::Kind::Getitem;
      result->items.push_back(literal(position(attribute), Value::from_int(std::stoll(attribute.value))));
      return result;
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
      result->items.push_back(std::move(tuple));
    }
    return result;
  }

  ExprPtr parse_subscribed() {
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
    return slice;
  }

  void parse_call_args(Expr& node) {
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

  ExprPtr parse_call(ExprPtr callee) {
    auto node = std::make_unique<Expr>();
    node->kind = Expr::Kind::Call;
    node->pos = position(current());
    node->object = std::move(callee);
    parse_call_args(*node);
    return node;
  }

  std::string dotted_name(const Token& first) {
    std::string name = first.value;
    while (is_op(".")) {
      next();
      name += "." + expect_name().value;
    }
    return name;
  }

  ExprPtr parse_filters(ExprPtr node) {
    while (is_op("|")) {
      next();
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
      node = std::move(filter);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
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
    } else if ((after.type == TokenType::Name || after.type == TokenType::String ||
                after.type == TokenType::Integer || after.type == TokenType::Float || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      // `x is divisibleby 3`: one argument without parentheses.
      if (is_name("is")) fail(after, "you cannot chain multiple tests with 'is'");
      test->items.push_back(parse_postfix(parse_primary()));
    }
    return test;
  }

  std::vector<Token> tokens_;
  std::size_t index_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace kvchat::jinja
