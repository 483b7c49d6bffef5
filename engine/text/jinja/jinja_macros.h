#pragma once
// Binding a call's arguments to a macro's parameters with the rules of Jinja2's Macro.__call__:
// positional arguments first, then keywords for the parameters left, extra arguments only where
// the body reads `varargs` / `kwargs`, and `caller` for a body that reads it.
#include <optional>
#include <string>
#include <vector>

#include "engine/text/jinja/jinja_value.h"

namespace kvchat::jinja {

struct MacroSignature {
  std::string name;  // "caller" for the body of a call block
  std::vector<std::string> parameters;
  bool catch_varargs = false;
  bool catch_kwargs = false;
  bool takes_caller = false;
};

struct BoundArguments {
  // One per parameter; nullopt where the call gave none (the default applies, or it is undefined).
  std::vector<std::optional<Value>> values;
  std::optional<Value> caller;   // set when the signature takes a caller
  std::optional<Value> varargs;  // a tuple, when the signature catches varargs
  std::optional<Value> kwargs;   // a dict, when the signature catches kwargs
};

// EvalError with Jinja2's TypeError text for too many positional or unknown keyword arguments.
BoundArguments bind_macro_arguments(const MacroSignature& signature, const CallArgs& args);

}  // namespace kvchat::jinja
