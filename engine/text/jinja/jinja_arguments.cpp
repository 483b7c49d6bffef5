#include "engine/text/jinja/jinja_arguments.h"

#include <algorithm>

namespace kvchat::jinja {

std::vector<std::optional<Value>> bind(const std::string& function, const CallArgs& args, std::size_t skip,
                                       std::initializer_list<const char*> parameters) {
  std::vector<std::optional<Value>> bound(parameters.size());
  std::vector<std::string> names(parameters.begin(), parameters.end());
  if (args.positional.size() > skip + names.size())
    throw EvalError(function + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                    std::to_string(args.positional.size() - skip) + " given)");
  for (std::size_t i = skip; i < args.positional.size(); ++i) bound[i - skip] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) throw EvalError(function + "() got an unexpected keyword argument '" + key + "'");
    auto index = static_cast<std::size_t>(it - names.begin());
    if (bound[index]) throw EvalError(function + "() got multiple values for argument '" + key + "'");
    bound[index] = value;
  }
  return bound;
}

bool bool_arg(const std::optional<Value>& arg, bool fallback) { return arg ? truthy(*arg) : fallback; }

std::int64_t int_arg(const std::string& function, const std::optional<Value>& arg, std::int64_t fallback) {
  if (!arg || arg->is_none()) return fallback;
  if (!arg->is_integral())
    throw EvalError(function + "(): expected an integer argument, got " + python_type_name(*arg));
  return arg->as_int();
}

std::optional<std::string> optional_str_arg(const std::string& function, const std::optional<Value>& arg) {
  if (!arg || arg->is_none()) return std::nullopt;
  if (!arg->is_string()) throw EvalError(function + "(): expected a string argument, got " + python_type_name(*arg));
  return arg->text;
}

std::string str_arg(const std::string& function, const std::optional<Value>& arg, const char* name) {
  if (!arg) throw EvalError(function + "() missing required argument '" + name + "'");
  if (!arg->is_string())
    throw EvalError(function + "(): argument '" + name + "' must be str, not " + python_type_name(*arg));
  return arg->text;
}

}  // namespace kvchat::jinja
