#pragma once
// The syntax tree of a parsed template: expressions and statements, each with its source position.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/jinja/jinja_value.h"

namespace kvchat::jinja {

struct Position {
  int line = 1;
  int column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // literal
    Name,      // name
    List,      // items
    Tuple,     // items
    Dict,      // items: key, value, key, value, ...
    Getattr,   // object.name
    Getitem,   // object[items[0]]
    Slice,     // items: start, stop, step (each may be null); only inside Getitem
    Call,      // object(items, keywords)
    Filter,    // object | name(items, keywords)
    Test,      // object is [not] name(items, keywords); negated
    Unary,     // name in {"-", "+", "not"}; object
    Binary,    // object name items[0], name in {+ - * / // % ** ~ and or}
    Compare,   // object ops[i] items[i] ...
    CondExpr,  // items: then, condition, else (else may be null)
  };
  Kind kind;
  Position pos;
  std::string name;
  Value literal;
  ExprPtr object;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  bool negated = false;
  int depth = 1;  // levels of the tree below and including this node (the parser bounds it)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// What `set` and `for` assign to: a name, a tuple of names, or a namespace attribute (ns.attr).
struct AssignTarget {
  std::vector<std::string> names;
  bool is_tuple = false;
  std::string namespace_attribute;  // non-empty: names[0] is the namespace, this the attribute
};

struct Stmt {
  enum class Kind {
    Text,      // literal data
    Output,    // {{ expr }}
    If,        // branches (condition, body); else_body
    For,       // target in expr [if filter]: body, else_body
    Set,       // target = expr
    SetBlock,  // {% set target %}body{% endset %}, optionally | filters (expr applies them to a placeholder)
    Break,
    Continue,
    Macro,        // {% macro name(parameters) %}body{% endmacro %}: assigns a callable to `name`
    CallBlock,    // {% call(parameters) expr %}body{% endcall %}: expr (a Call) gets caller= the body as a macro
    FilterBlock,  // {% filter f(args)|g %}body{% endfilter %}: expr applies the filters to a placeholder
  };
  Kind kind;
  Position pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  AssignTarget target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  // Macro and CallBlock: the parameters in order, each with its default (null: none); the names the
  // body reads that make Jinja2 accept extra arguments or a caller.
  std::vector<std::pair<std::string, ExprPtr>> parameters;
  bool catch_varargs = false;  // the body reads `varargs`
  bool catch_kwargs = false;   // the body reads `kwargs`
  bool takes_caller = false;   // the body reads `caller`
};

}  // namespace kvchat::jinja
