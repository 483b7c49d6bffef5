// Attribute lookup (x.y): the methods of str, dict and list (one table) and the loop variable's attributes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/jinja/jinja_arguments.h"
#include "engine/text/jinja/jinja_builtins.h"
#include "engine/text/jinja/jinja_pystr.h"

namespace kvchat::jinja {

namespace {

// `self` is the str, dict, list or tuple; `fn` the qualified name ("str.split", "tuple.index")
// that Python's error messages use.
using MethodFn = Value (*)(const Value& self, const std::string& fn, const CallArgs& args);

// ------------------------------------------------------------------ str

// strip, lstrip and rstrip.
template <bool kLeft, bool kRight>
Value str_strip(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"chars"});
  return Value::from_string(pystr::strip(self.text, optional_str_arg(fn, a[0]), kLeft, kRight));
}

// split and rsplit.
template <std::vector<std::string> (*kSplit)(std::string_view, const std::optional<std::string>&, std::int64_t)>
Value str_split(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"sep", "maxsplit"});
  auto separator = optional_str_arg(fn, a[0]);
  std::int64_t max_split = int_arg(fn, a[1], -1);
  ValueList items;
  for (auto& part : kSplit(self.text, separator, max_split)) items.push_back(Value::from_string(std::move(part)));
  return Value::from_list(std::move(items));
}

Value str_splitlines(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"keepends"});
  if (bool_arg(a[0], false)) throw EvalError("str.splitlines(keepends=True) is not supported");
  ValueList items;
  for (auto& line : pystr::splitlines(self.text)) items.push_back(Value::from_string(std::move(line)));
  return Value::from_list(std::move(items));
}

// startswith and endswith: the argument is a str or a tuple of str.
template <bool kPrefix>
Value str_affix_test(const Value& self, const std::string& fn, const CallArgs& args) {
  const std::string method = kPrefix ? "startswith" : "endswith";
  const std::string& text = self.text;
  auto a = bind(fn, args, 0, {"prefix", "start", "end"});
  if (!a[0]) throw EvalError(fn + "() takes at least 1 argument (0 given)");
  if (a[1] || a[2]) throw EvalError(fn + "() with start/end positions is not supported");
  std::vector<std::string> candidates;
  if (a[0]->is_string()) {
    candidates.push_back(a[0]->text);
  } else if (a[0]->kind == Kind::List && a[0]->sequence == Sequence::Tuple) {
    for (const Value& item : a[0]->items()) {
      if (!item.is_string())
        throw EvalError("tuple for " + method + " must only contain str, not " + python_type_name(item));
      candidates.push_back(item.text);
    }
  } else {
    throw EvalError(method + " first arg must be str or a tuple of str, not " + python_type_name(*a[0]));
  }
  for (const std::string& c : candidates) {
    bool hit = kPrefix ? text.compare(0, c.size(), c) == 0
                       : text.size() >= c.size() && text.compare(text.size() - c.size(), c.size(), c) == 0;
    if (hit) return Value::from_bool(true);
  }
  return Value::from_bool(false);
}

// upper, lower, title and capitalize: `kMap` is the pystr case mapping.
template <std::string (*kMap)(std::string_view)>
Value str_case(const Value& self, const std::string& fn, const CallArgs& args) {
  bind(fn, args, 0, {});
  return Value::from_string(kMap(self.text));
}

// islower and isupper.
template <bool (*kTest)(std::string_view)>
Value str_case_test(const Value& self, const std::string& fn, const CallArgs& args) {
  bind(fn, args, 0, {});
  return Value::from_bool(kTest(self.text));
}

Value str_replace(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"old", "new", "count"});
  return Value::from_string(
      pystr::replace(self.text, str_arg(fn, a[0], "old"), str_arg(fn, a[1], "new"), int_arg(fn, a[2], -1)));
}

// find and count.
template <std::int64_t (*kSearch)(std::string_view, std::string_view)>
Value str_search(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"sub"});
  return Value::from_int(kSearch(self.text, str_arg(fn, a[0], "sub")));
}

Value str_removeprefix(const Value& self, const std::string& fn, const CallArgs& args) {
  const std::string& text = self.text;
  auto a = bind(fn, args, 0, {"affix"});
  std::string affix = str_arg(fn, a[0], "affix");
  return Value::from_string(text.compare(0, affix.size(), affix) == 0 ? text.substr(affix.size()) : text);
}

Value str_removesuffix(const Value& self, const std::string& fn, const CallArgs& args) {
  const std::string& text = self.text;
  auto a = bind(fn, args, 0, {"affix"});
  std::string affix = str_arg(fn, a[0], "affix");
  bool ends = text.size() >= affix.size() && text.compare(text.size() - affix.size(), affix.size(), affix) == 0;
  return Value::from_string(ends ? text.substr(0, text.size() - affix.size()) : text);
}

Value str_join(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"iterable"});
  if (!a[0]) throw EvalError("str.join() takes exactly one argument (0 given)");
  std::string out;
  std::size_t index = 0;
  for (const Value& item : iterate(*a[0])) {
    if (!item.is_string())
      throw EvalError("sequence item " + std::to_string(index) + ": expected str instance, " + python_type_name(item) +
                      " found");
    if (index++) out += self.text;
    out += item.text;
  }
  return Value::from_string(std::move(out));
}

// ------------------------------------------------------------------ dict

Value dict_get(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"key", "default"});
  if (!a[0]) throw EvalError("dict.get() expected at least 1 argument, got 0");
  const Value* found = dict_find(self.entries(), *a[0]);
  return found ? *found : (a[1] ? *a[1] : Value::none());
}

Value dict_items(const Value& self, const std::string& fn, const CallArgs& args) {
  bind(fn, args, 0, {});
  return Value::from_list(dict_items_as_tuples(self.entries()), Sequence::View);
}

// keys and values.
template <bool kKeys>
Value dict_keys_or_values(const Value& self, const std::string& fn, const CallArgs& args) {
  bind(fn, args, 0, {});
  ValueList items;
  for (const auto& [key, value] : self.entries()) items.push_back(kKeys ? key : value);
  return Value::from_list(std::move(items), Sequence::View);
}

Value dict_copy(const Value& self, const std::string&, const CallArgs&) { return Value::from_dict(self.entries()); }

// ------------------------------------------------------------------ list and tuple

Value list_count(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"value"});
  if (!a[0]) throw EvalError(fn + "() takes exactly one argument (0 given)");
  std::int64_t n = 0;
  for (const Value& item : self.items()) n += equals(item, *a[0]) ? 1 : 0;
  return Value::from_int(n);
}

Value list_index(const Value& self, const std::string& fn, const CallArgs& args) {
  auto a = bind(fn, args, 0, {"value"});
  if (!a[0]) throw EvalError(fn + "() takes exactly one argument (0 given)");
  for (std::size_t i = 0; i < self.items().size(); ++i)
    if (equals(self.items()[i], *a[0])) return Value::from_int(static_cast<std::int64_t>(i));
  throw EvalError(to_repr(*a[0]) + " is not in list");
}

Value list_copy(const Value& self, const std::string&, const CallArgs&) { return Value::from_list(self.items()); }

// ------------------------------------------------------------------ the table

// Every public method of Python's str, dict, list and tuple, keyed "type.name". nullptr: Python
// has the method and this interpreter does not; x.name still gives a bound method (so `is defined`
// and `is callable` answer as in Jinja2), and calling it is the error.
const std::unordered_map<std::string_view, MethodFn>& methods() {
  static const std::unordered_map<std::string_view, MethodFn> table = {
      {"str.capitalize", str_case<pystr::capitalize>},
      {"str.casefold", nullptr},
      {"str.center", nullptr},
      {"str.count", str_search<pystr::count>},
      {"str.encode", nullptr},
      {"str.endswith", str_affix_test<false>},
      {"str.expandtabs", nullptr},
      {"str.find", str_search<pystr::find>},
      {"str.format", nullptr},
      {"str.format_map", nullptr},
      {"str.index", nullptr},
      {"str.isalnum", nullptr},
      {"str.isalpha", nullptr},
      {"str.isascii", nullptr},
      {"str.isdecimal", nullptr},
      {"str.isdigit", nullptr},
      {"str.isidentifier", nullptr},
      {"str.islower", str_case_test<pystr::is_lower>},
      {"str.isnumeric", nullptr},
      {"str.isprintable", nullptr},
      {"str.isspace", nullptr},
      {"str.istitle", nullptr},
      {"str.isupper", str_case_test<pystr::is_upper>},
      {"str.join", str_join},
      {"str.ljust", nullptr},
      {"str.lower", str_case<pystr::lower>},
      {"str.lstrip", str_strip<true, false>},
      {"str.maketrans", nullptr},
      {"str.partition", nullptr},
      {"str.removeprefix", str_removeprefix},
      {"str.removesuffix", str_removesuffix},
      {"str.replace", str_replace},
      {"str.rfind", nullptr},
      {"str.rindex", nullptr},
      {"str.rjust", nullptr},
      {"str.rpartition", nullptr},
      {"str.rsplit", str_split<pystr::rsplit>},
      {"str.rstrip", str_strip<false, true>},
      {"str.split", str_split<pystr::split>},
      {"str.splitlines", str_splitlines},
      {"str.startswith", str_affix_test<true>},
      {"str.strip", str_strip<true, true>},
      {"str.swapcase", nullptr},
      {"str.title", str_case<pystr::title>},
      {"str.translate", nullptr},
      {"str.upper", str_case<pystr::upper>},
      {"str.zfill", nullptr},

      {"dict.clear", nullptr},
      {"dict.copy", dict_copy},
      {"dict.fromkeys", nullptr},
      {"dict.get", dict_get},
      {"dict.items", dict_items},
      {"dict.keys", dict_keys_or_values<true>},
      {"dict.pop", nullptr},
      {"dict.popitem", nullptr},
      {"dict.setdefault", nullptr},
      {"dict.update", nullptr},
      {"dict.values", dict_keys_or_values<false>},

      {"list.append", nullptr},
      {"list.clear", nullptr},
      {"list.copy", list_copy},
      {"list.count", list_count},
      {"list.extend", nullptr},
      {"list.index", list_index},
      {"list.insert", nullptr},
      {"list.pop", nullptr},
      {"list.remove", nullptr},
      {"list.reverse", nullptr},
      {"list.sort", nullptr},

      {"tuple.count", list_count},
      {"tuple.index", list_index},
  };
  return table;
}

// A method of str called on a Markup, as markupsafe (2.1, the version the reference renders used)
// overrides them: the case and strip methods and replace escape their string arguments and return
// Markup; split and friends return lists of Markup; join escapes the items. Everything else answers
// as for a str (removeprefix, for one, returns a plain str there).
Value call_markup_method(const Value& self, const std::string& name, const std::string& fn, MethodFn method,
                         CallArgs args) {
  static const char* const kEscaping[] = {"capitalize", "title",  "lower",  "upper",
                                          "replace",    "lstrip", "rstrip", "strip"};
  bool escaping = std::find(std::begin(kEscaping), std::end(kEscaping), name) != std::end(kEscaping);
  if (escaping) {
    for (Value& arg : args.positional)
      if (arg.is_string()) arg = escape_to_markup(arg);
    for (auto& keyword : args.keyword)
      if (keyword.second.is_string()) keyword.second = escape_to_markup(keyword.second);
    return Value::from_markup(method(self, fn, args).text);
  }
  if (name == "join" && !args.positional.empty()) {
    ValueList escaped;
    for (const Value& item : iterate(args.positional[0])) escaped.push_back(escape_to_markup(item));
    args.positional[0] = Value::from_list(std::move(escaped));
    return Value::from_markup(method(self, fn, args).text);
  }
  Value result = method(self, fn, args);
  if (name == "split" || name == "rsplit" || name == "splitlines") {
    ValueList parts = result.items();
    for (Value& part : parts) part.markup = true;
    return Value::from_list(std::move(parts));
  }
  return result;
}

// x.name as a callable when `object`'s type has a method of that name, else nullopt.
std::optional<Value> bound_method(const Value& object, const std::string& name) {
  // Markup is a str subclass: it has str's methods (call_markup_method adds its overrides).
  std::string fn = (object.is_string() ? std::string("str") : python_type_name(object)) + "." + name;
  auto found = methods().find(fn);
  if (found == methods().end()) return std::nullopt;
  MethodFn method = found->second;
  return Value::from_callable(fn, [object, name, fn, method](const CallArgs& args) {
    if (method && object.markup) return call_markup_method(object, name, fn, method, args);
    if (method) return method(object, fn, args);
    // Templates only read values: a dict's or list's missing methods are the mutating ones.
    std::string why = object.is_string() ? "" : " (templates cannot modify a " + python_type_name(object) + ")";
    throw EvalError("the method " + fn + "() is not supported" + why);
  });
}

// ------------------------------------------------------------------ loop attributes

using LoopAttributeFn = Value (*)(const Value& loop_value);

std::int64_t loop_length(const LoopData& loop) { return static_cast<std::int64_t>(loop.items->size()); }

Value loop_previtem(const Value& loop_value) {
  const LoopData& loop = *loop_value.loop;
  return loop.index0 > 0 ? (*loop.items)[static_cast<std::size_t>(loop.index0 - 1)]
                         : Value::undefined("there is no previous item");
}

Value loop_nextitem(const Value& loop_value) {
  const LoopData& loop = *loop_value.loop;
  return loop.index0 + 1 < loop_length(loop) ? (*loop.items)[static_cast<std::size_t>(loop.index0 + 1)]
                                             : Value::undefined("there is no next item");
}

Value loop_cycle(const Value& loop_value) {
  std::int64_t index0 = loop_value.loop->index0;
  return Value::from_callable("loop.cycle", [index0](const CallArgs& args) {
    if (args.positional.empty()) throw EvalError("no items for cycling given");
    return args.positional[static_cast<std::size_t>(index0) % args.positional.size()];
  });
}

Value loop_changed(const Value& loop_value) {
  std::shared_ptr<LoopData> data = loop_value.loop;
  return Value::from_callable("loop.changed", [data](const CallArgs& args) {
    Value current = Value::from_list(args.positional);
    bool changed = !data->last_changed || !equals(*data->last_changed, current);
    if (changed) data->last_changed = std::make_shared<Value>(current);
    return Value::from_bool(changed);
  });
}

Value loop_attribute(const Value& loop_value, const std::string& name) {
  static const std::unordered_map<std::string_view, LoopAttributeFn> table = {
      {"index", [](const Value& v) { return Value::from_int(v.loop->index0 + 1); }},
      {"index0", [](const Value& v) { return Value::from_int(v.loop->index0); }},
      {"revindex", [](const Value& v) { return Value::from_int(loop_length(*v.loop) - v.loop->index0); }},
      {"revindex0", [](const Value& v) { return Value::from_int(loop_length(*v.loop) - v.loop->index0 - 1); }},
      {"first", [](const Value& v) { return Value::from_bool(v.loop->index0 == 0); }},
      {"last", [](const Value& v) { return Value::from_bool(v.loop->index0 == loop_length(*v.loop) - 1); }},
      {"length", [](const Value& v) { return Value::from_int(loop_length(*v.loop)); }},
      {"depth", [](const Value& v) { return Value::from_int(v.loop->depth0 + 1); }},
      {"depth0", [](const Value& v) { return Value::from_int(v.loop->depth0); }},
      {"previtem", loop_previtem},
      {"nextitem", loop_nextitem},
      {"cycle", loop_cycle},
      {"changed", loop_changed},
  };
  auto found = table.find(name);
  if (found == table.end()) return Value::undefined("'LoopContext object' has no attribute '" + name + "'");
  return found->second(loop_value);
}

}  // namespace

// ------------------------------------------------------------------ lookup

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) fail_undefined(object);
  auto missing = [&] {
    return Value::undefined((object.is_none() ? "'None'" : "'" + type_description(object) + "'") +
                            " has no attribute '" + name + "'");
  };
  if (!name.empty() && name[0] == '_') return missing();  // the sandbox hides private attributes
  // A method of str, dict, list or tuple; a dict's method names shadow its keys, as in Jinja2.
  if (auto method = bound_method(object, name)) return *method;
  switch (object.kind) {
    case Kind::Dict: {
      const Value* found = dict_find(object.entries(), Value::from_string(name));
      return found ? *found : missing();
    }
    case Kind::Namespace: {
      const Value* found = dict_find(object.ns->attributes, Value::from_string(name));
      return found ? *found : missing();
    }
    case Kind::Loop: return loop_attribute(object, name);
    default: return missing();
  }
}

}  // namespace kvchat::jinja
