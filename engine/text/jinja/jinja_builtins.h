#pragma once
// Jinja2's filters and tests, the Python methods templates call on strings, dicts and lists, and
// attribute/item lookup with the sandbox's rules (x.y tries the attribute first, x['y'] the item).
// Implemented in jinja_filters.cpp, jinja_methods.cpp (attributes and methods) and
// jinja_operators.cpp (operators, comparisons, subscription and tests).
#include <cstdint>
#include <string>

#include "engine/text/jinja/jinja_value.h"

namespace kvchat::jinja {

enum class Support { Supported, KnownUnsupported, Unknown };

// Whether Jinja2 has a filter/test of this name, and whether this interpreter implements it.
Support filter_support(const std::string& name);
Support test_support(const std::string& name);

// Applies a filter or test. Throws EvalError on bad arguments or values.
Value apply_filter(const std::string& name, const Value& value, const CallArgs& args);
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);

// environment.getattr / environment.getitem of the sandbox.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] with Python's rules for missing and negative bounds.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// Python's `in` operator (str: substring, list: membership, dict: key).
bool contains(const Value& container, const Value& item);
// `left op right` for the comparison operators: "==", "!=", "<", ">", "<=", ">=", "in", "not in".
bool compare(const std::string& op, const Value& left, const Value& right);

// Operators with Python's rules: "+", "-", "*", "/", "//", "%", "**".
Value binary_operator(const std::string& op, const Value& left, const Value& right);
Value unary_minus(const Value& operand, bool negate);
// len(range(start, stop, step)) for step != 0, without overflow for any int64 bounds.
std::uint64_t range_length(std::int64_t start, std::int64_t stop, std::int64_t step);

}  // namespace kvchat::jinja
