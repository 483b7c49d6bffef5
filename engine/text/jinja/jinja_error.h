#pragma once
// The Jinja interpreter's errors, apart from its front door (chat_template.h) so that the lexer,
// parser, values and builtins can throw them without depending on ChatTemplate.
#include <stdexcept>

namespace kvchat {

// A template that cannot be parsed or rendered; the message names the position (line:column).
struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace kvchat

namespace kvchat::jinja {

// A failure while evaluating, without a position yet: the interpreter adds line:column of the
// expression being evaluated and turns it into a TemplateError.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace kvchat::jinja
