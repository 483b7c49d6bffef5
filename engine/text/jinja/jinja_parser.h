#pragma once
// Turns tokens into a syntax tree following Jinja2's own grammar (operator precedence, filters
// binding tighter than arithmetic, `if` tests without inline if-expressions, ...).
#include <string>

#include "engine/text/jinja/jinja_ast.h"

namespace kvchat::jinja {

// Throws kvchat::TemplateError ("line:column: ...") on a syntax error, an unknown filter or test,
// or a construct this interpreter does not support.
Body parse_template(const std::string& source);

}  // namespace kvchat::jinja
