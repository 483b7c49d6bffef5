#include "engine/text/jinja/jinja_parser.h"

#include <initializer_list>

#include "engine/text/jinja/jinja_expression_parser.h"
#include "engine/text/jinja/jinja_lexer.h"

namespace kvchat::jinja {

namespace {

// The template body and its statements ({% if %}, {% for %}, {% set %}, ...), over the expression parser.
class Parser : public ExpressionParser {
 public:
  explicit Parser(std::vector<Token> tokens) : ExpressionParser(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (current().type != TokenType::Eof) fail(current(), "unexpected " + token_text(current()));
    return body;
  }

 private:
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

  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace kvchat::jinja
