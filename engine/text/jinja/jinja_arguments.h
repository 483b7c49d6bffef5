#pragma once
// Binding the arguments of a filter, test or method call to a Python-style parameter list, with
// the TypeError messages Python gives for a bad call.
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "engine/text/jinja/jinja_value.h"

namespace kvchat::jinja {

// Binds positional and keyword arguments to `parameters`, after skipping the first `skip`
// positional ones (a filter's or test's own value). Unbound parameters stay empty.
std::vector<std::optional<Value>> bind(const std::string& function, const CallArgs& args, std::size_t skip,
                                       std::initializer_list<const char*> parameters);

bool bool_arg(const std::optional<Value>& arg, bool fallback);
// None or absent gives `fallback`; anything but an int or bool is an EvalError.
std::int64_t int_arg(const std::string& function, const std::optional<Value>& arg, std::int64_t fallback);
// None or absent gives nullopt; anything but a str is an EvalError.
std::optional<std::string> optional_str_arg(const std::string& function, const std::optional<Value>& arg);
// A required str parameter called `name`.
std::string str_arg(const std::string& function, const std::optional<Value>& arg, const char* name);

}  // namespace kvchat::jinja
