#pragma once
// Executes a parsed template with Jinja2's runtime semantics: a for loop body gets a fresh scope on
// every iteration (a `set` inside it changes nothing outside, not even the next iteration), `if`
// opens no scope, namespace() objects are shared, and the sandbox's globals are available.
#include <string>

#include "engine/text/jinja/jinja_ast.h"

namespace kvchat::jinja {

// `context` must be a dict (the template's global variables). `today` ("YYYY-MM-DD") fixes
// strftime_now; empty = now. Throws kvchat::TemplateError ("line:column: ...") on a runtime error,
// or with exactly the message passed to raise_exception().
std::string render(const Body& body, const Value& context, const std::string& today);

}  // namespace kvchat::jinja
