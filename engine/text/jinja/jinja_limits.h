#pragma once
// What one template may cost. A chat template comes with a model folder, that is from a stranger, so
// parsing and rendering are bounded by the template's size times constants, never by numbers the
// template chooses. Every limit is far above what real chat templates reach (the fixtures under
// shared/fixtures/chat_templates nest at most ~10 levels, chain at most a few dozen operators, run
// well under 10^5 steps and produce kilobytes).
#include <cstddef>
#include <cstdint>

namespace kvchat::jinja {

// Parsing: nesting of expressions (parentheses, brackets, calls, unary operators) and the depth of
// an expression's tree, where a chain of binary operators, filters or attribute lookups counts one
// level per term (`'a' ~ 'a' ~ ... ~ 'a'` with 300 terms is too deep; real chains have a few dozen
// terms). The evaluator recurses over the tree, so this bounds its stack.
constexpr int kMaxExpressionDepth = 256;
// Parsing: nested block statements ({% if %} inside {% for %} inside {% macro %} ...).
constexpr int kMaxStatementDepth = 256;
// Rendering: nested macro calls (recursion included); Python's own recursion limit stops Jinja2 at a
// similar depth.
constexpr int kMaxMacroDepth = 256;
// Rendering: statements and expressions being evaluated at once, macro calls included. The two
// parse limits bound one template's tree; this bounds the stack of macros calling deep trees.
constexpr int kMaxRenderDepth = 1024;

// Rendering: lists and dicts nested inside each other (`{% set ns.l = [ns.l] %}` in a loop builds one
// level per iteration at no cost, then printing, comparing or freeing it recurses once per level).
// Also the deepest JSON a template receives (messages, tools).
constexpr int kMaxValueNesting = 256;

// Rendering: namespace() objects made by one render (real templates make one or two).
constexpr int kMaxNamespaces = 65536;

// Rendering: evaluation steps in total, every expression evaluated, statement executed, loop
// iteration, comparison and item or 64 bytes of a value produced counting one.
constexpr std::int64_t kMaxRenderSteps = 10'000'000;
constexpr std::int64_t kBytesPerStep = 64;
// Rendering: the largest output, and the largest string, list or dict a template may build (a list
// or dict counts sizeof(Value) per item plus its strings' bytes). Checked before allocating.
constexpr std::size_t kMaxValueBytes = std::size_t{16} << 20;

}  // namespace kvchat::jinja
