#include "engine/text/jinja/jinja_parser.h"

#include <initializer_list>

#include "engine/text/jinja/jinja_expression_parser.h"
#include "engine/text/jinja/jinja_lexer.h"
#include "engine/text/jinja/jinja_limits.h"

namespace kvchat::jinja {

namespace {

// Whether an expression or statement list reads the variable `name` anywhere (Jinja2 decides from
// this whether a macro takes varargs, kwargs or a caller).
bool reads_name(const Body& body, const std::string& name);

bool reads_name(const Expr* expr, const std::string& name) {
  if (!expr) return false;
  if (expr->kind == Expr::Kind::Name && expr->name == name) return true;
  if (reads_name(expr->object.get(), name)) return true;
  for (const ExprPtr& item : expr->items)
    if (reads_name(item.get(), name)) return true;
  for (const auto& keyword : expr->keywords)
    if (reads_name(keyword.second.get(), name)) return true;
  return false;
}

bool reads_name(const Body& body, const std::string& name) {
  for (const StmtPtr& stmt : body) {
    if (reads_name(stmt->expr.get(), name) || reads_name(stmt->filter.get(), name)) return true;
    for (const auto& [condition, branch] : stmt->branches)
      if (reads_name(condition.get(), name) || reads_name(branch, name)) return true;
    for (const auto& parameter : stmt->parameters)
      if (reads_name(parameter.second.get(), name)) return true;
    if (reads_name(stmt->body, name) || reads_name(stmt->else_body, name)) return true;
  }
  return false;
}

// A placeholder for the rendered body of a block that filters it ({% set x | f %}, {% filter f %}).
ExprPtr block_placeholder(Position pos) {
  auto placeholder = std::make_unique<Expr>();
  placeholder->kind = Expr::Kind::Name;
  placeholder->name = "";
  placeholder->pos = pos;
  return placeholder;
}

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
        if (is_name("generation")) {
          // transformers' AssistantTracker tag (SmolLM3's template): it marks the assistant's text for a
          // training mask and renders its body unchanged, so the body joins the enclosing one.
          const Token& opening = next();
          for (StmtPtr& stmt : parse_statements({"endgeneration"}, true, opening)) body.push_back(std::move(stmt));
        } else {
          body.push_back(parse_statement());
        }
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
    // The body's statements are parsed (and later executed) recursively: bound the nesting.
    if (statement_depth_ >= kMaxStatementDepth)
      fail(opening, "statements nested too deeply (more than " + std::to_string(kMaxStatementDepth) +
                        " levels of blocks such as if, for, macro or set)");
    ++statement_depth_;
    Body body = subparse(end_tags);
    --statement_depth_;
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
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    static const char* const kKnownUnsupported[] = {"block",      "extends", "include", "import", "from",     "with",
                                                    "autoescape", "print",   "do",      "trans",  "pluralize"};
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
    if (is_op("|")) stmt->filter = parse_filters(block_placeholder(position(current())));
    stmt->body = parse_statements({"endset"}, true, opening);
    return stmt;
  }

  // (a, b=default, ...): Jinja2's parse_signature.
  void parse_signature(Stmt& stmt) {
    expect_op("(");
    while (!is_op(")")) {
      if (!stmt.parameters.empty()) expect_op(",");
      std::string name = expect_name().value;
      ExprPtr fallback;
      if (skip_op("=")) {
        fallback = parse_expression(true);
      } else if (!stmt.parameters.empty() && stmt.parameters.back().second) {
        fail(current(), "non-default argument follows default argument");
      }
      stmt.parameters.emplace_back(std::move(name), std::move(fallback));
    }
    expect_op(")");
  }

  // The body of a macro or call block: a new function, so break/continue of an enclosing loop do not
  // reach into it; the names it reads decide which extra arguments it takes.
  void parse_function_body(Stmt& stmt, const char* end_tag, const Token& opening) {
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    stmt.body = parse_statements({end_tag}, true, opening);
    loop_depth_ = saved_loop_depth;
    stmt.catch_varargs = reads_name(stmt.body, "varargs");
    stmt.catch_kwargs = reads_name(stmt.body, "kwargs");
    stmt.takes_caller = reads_name(stmt.body, "caller");
  }

  StmtPtr parse_macro() {
    const Token& opening = next();
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = Stmt::Kind::Macro;
    stmt->pos = position(opening);
    stmt->target.names.push_back(expect_name().value);
    parse_signature(*stmt);
    parse_function_body(*stmt, "endmacro", opening);
    return stmt;
  }

  StmtPtr parse_call_block() {
    const Token& opening = next();
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = Stmt::Kind::CallBlock;
    stmt->pos = position(opening);
    if (is_op("(")) parse_signature(*stmt);
    const Token& call_at = current();
    stmt->expr = parse_expression(true);
    if (stmt->expr->kind != Expr::Kind::Call) fail(call_at, "expected call");
    parse_function_body(*stmt, "endcall", opening);
    return stmt;
  }

  StmtPtr parse_filter_block() {
    const Token& opening = next();
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = Stmt::Kind::FilterBlock;
    stmt->pos = position(opening);
    stmt->filter = parse_filters(block_placeholder(position(current())), true);
    stmt->body = parse_statements({"endfilter"}, true, opening);
    return stmt;
  }

  AssignTarget parse_assign_target(bool with_namespace, EndTags extra_end) {
    AssignTarget target;
    const Token& first = current();
    if (with_namespace && first.type == TokenType::Name && look().type == TokenType::Operator && look().value == ".") {
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
  int statement_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace kvchat::jinja
