#include "engine/text/jinja/jinja_macros.h"

#include <algorithm>
#include <utility>

#include "engine/text/jinja/jinja_error.h"

namespace kvchat::jinja {

BoundArguments bind_macro_arguments(const MacroSignature& signature, const CallArgs& args) {
  const std::size_t count = signature.parameters.size();
  std::vector<std::pair<std::string, Value>> keywords = args.keyword;
  auto take_keyword = [&keywords](const std::string& name) -> std::optional<Value> {
    auto found = std::find_if(keywords.begin(), keywords.end(), [&](const auto& k) { return k.first == name; });
    if (found == keywords.end()) return std::nullopt;
    Value value = std::move(found->second);
    keywords.erase(found);
    return value;
  };

  BoundArguments bound;
  for (std::size_t i = 0; i < count && i < args.positional.size(); ++i) bound.values.emplace_back(args.positional[i]);
  // A parameter named `caller` receives the call block's body like any keyword argument.
  bool found_caller =
      std::find(signature.parameters.begin(), signature.parameters.end(), "caller") != signature.parameters.end();
  for (std::size_t i = bound.values.size(); i < count; ++i)
    bound.values.push_back(take_keyword(signature.parameters[i]));

  if (signature.takes_caller && !found_caller) {
    std::optional<Value> caller = take_keyword("caller");
    bound.caller = caller && !caller->is_none() ? *caller : Value::undefined("No caller defined");
  }
  if (signature.catch_kwargs) {
    DictEntries entries;
    for (auto& [key, value] : keywords) entries.emplace_back(Value::from_string(key), std::move(value));
    bound.kwargs = Value::from_dict(std::move(entries));
  } else if (!keywords.empty()) {
    bool caller = std::any_of(keywords.begin(), keywords.end(), [](const auto& k) { return k.first == "caller"; });
    if (caller)
      throw EvalError("macro '" + signature.name +
                      "' was invoked with two values for the special caller argument. This is most likely a bug.");
    throw EvalError("macro '" + signature.name + "' takes no keyword argument '" + keywords.front().first + "'");
  }
  if (signature.catch_varargs) {
    ValueList extra;
    for (std::size_t i = count; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
    bound.varargs = Value::from_list(std::move(extra), Sequence::Tuple);
  } else if (args.positional.size() > count) {
    throw EvalError("macro '" + signature.name + "' takes not more than " + std::to_string(count) + " argument(s)");
  }
  return bound;
}

}  // namespace kvchat::jinja
