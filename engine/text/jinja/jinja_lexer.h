#pragma once
// Splits template source into tokens the way Jinja2's lexer does with trim_blocks=True,
// lstrip_blocks=True and keep_trailing_newline=False: newlines normalised to "\n", one trailing
// newline dropped, "{%-"/"-%}"/"{{-"/"-}}"/"{#-"/"-#}" strip whitespace, "{%+"/"+%}" opt out.
#include <string>
#include <vector>

namespace kvchat::jinja {

enum class TokenType {
  Data,        // literal template text (after whitespace control)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // value holds the decoded literal
  Integer,
  Float,
  Operator,  // value holds the operator text
  Eof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int column = 1;
};

const char* describe(TokenType type);

// Throws kvchat::TemplateError ("line:column: ...") on an unterminated tag, comment or string or
// a character that cannot start a token.
std::vector<Token> tokenize(const std::string& source);

}  // namespace kvchat::jinja
