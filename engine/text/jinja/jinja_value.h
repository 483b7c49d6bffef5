#pragma once
// The values a chat template computes with, modelled on the Python objects Jinja2 works on, so that
// truthiness, equality, str() and repr() come out exactly as they do under transformers.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/jinja/jinja_error.h"

namespace kvchat::jinja {

struct Value;
using ValueList = std::vector<Value>;
using DictEntries = std::vector<std::pair<Value, Value>>;  // insertion order, as Python dicts keep it

enum class Kind {
  Undefined,  // jinja2.Undefined: renders as "", falsy, iterates as empty, fails on most operations
  None,
  Bool,
  Int,
  Float,
  String,  // UTF-8
  List,    // list, tuple, generator or view (see Sequence)
  Dict,
  Namespace,  // jinja2's namespace(): the one mutable object (attribute assignment from `set`)
  Loop,       // the `loop` variable of a for loop
  Callable,   // a global function or a bound method
};

// Python has several sequence types that templates can tell apart (repr, len, indexing).
enum class Sequence {
  List,       // list: repr [..], len, indexing
  Tuple,      // tuple: repr (..), len, indexing
  Generator,  // map()/select()/items() filters: no len, no indexing, always truthy, repr is an address
  View,       // dict.items()/keys()/values(), range(): len, no indexing, repr not reproduced
};

struct NamespaceData {
  DictEntries attributes;
};

struct LoopData {
  std::shared_ptr<const ValueList> items;
  std::int64_t index0 = 0;
  std::int64_t depth0 = 0;
  std::shared_ptr<Value> last_changed;  // loop.changed() state
};

struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct CallableData {
  std::string name;  // for error messages: "raise_exception", "str.split", ...
  std::function<Value(const CallArgs&)> call;
};

struct Value {
  Kind kind = Kind::Undefined;
  bool boolean = false;
  std::int64_t integer = 0;
  double number = 0.0;
  std::string text;  // String: the text; Undefined: the error to raise when it is used
  // String only: a markupsafe.Markup (what `safe` returns). Output is unchanged, since autoescape is
  // off, but plain strings combined with it by `+` or its methods get HTML-escaped (see html_escape).
  bool markup = false;
  Sequence sequence = Sequence::List;
  // List and Dict: how many lists and dicts deep this one is (1 for one holding none). Printing,
  // comparing and freeing a value recurse through it, so kMaxValueNesting bounds their stack.
  int nesting = 0;
  std::shared_ptr<const ValueList> list;
  std::shared_ptr<const DictEntries> dict;
  std::shared_ptr<NamespaceData> ns;
  std::shared_ptr<LoopData> loop;
  std::shared_ptr<const CallableData> callable;

  static Value undefined(std::string reason = "value is undefined");
  static Value none();
  static Value from_bool(bool b);
  static Value from_int(std::int64_t i);
  static Value from_float(double f);
  static Value from_string(std::string s);
  static Value from_markup(std::string s);
  static Value from_list(ValueList items, Sequence sequence = Sequence::List);
  static Value from_dict(DictEntries entries);
  static Value from_callable(std::string name, std::function<Value(const CallArgs&)> call);
  static Value from_json(const nlohmann::ordered_json& json);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  // int, float or bool: Python's bool is an int.
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_integral() const { return kind == Kind::Int || kind == Kind::Bool; }
  std::int64_t as_int() const { return kind == Kind::Bool ? (boolean ? 1 : 0) : integer; }
  double as_float() const { return kind == Kind::Float ? number : static_cast<double>(as_int()); }
  const ValueList& items() const { return *list; }
  const DictEntries& entries() const { return *dict; }
};

// Python's type name as its error messages use it ("NoneType", "str", "list", ...).
std::string python_type_name(const Value& value);
// Python's type name as Jinja2's messages use it ("dict object", "None", "str object").
std::string type_description(const Value& value);
// Throws the undefined value's error (jinja2.exceptions.UndefinedError).
[[noreturn]] void fail_undefined(const Value& value);
// Throws for an int result beyond 64 bits, where Python would carry on with a big integer.
[[noreturn]] void fail_integer_overflow();

bool truthy(const Value& value);
// Python ==, with Jinja2's Undefined.__eq__ (undefined equals only undefined).
bool equals(const Value& a, const Value& b);
// Python <; EvalError for types Python cannot order.
bool less_than(const Value& a, const Value& b);
// Python str(): what {{ value }} prints. Undefined prints as "".
std::string to_str(const Value& value);
// Python repr(), as str() of a list shows its items.
std::string to_repr(const Value& value);
// Python float repr: shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string float_repr(double value);

// The items a for loop (or list(), join, ...) goes through: a list's items, a dict's keys, a
// string's characters; undefined iterates as empty. EvalError for what Python cannot iterate.
ValueList iterate(const Value& value);
// len(); EvalError where Python raises TypeError (generators, numbers, None).
std::int64_t length_of(const Value& value);

struct JsonFormat {
  std::optional<std::string> indent;  // None: everything on one line
  std::string item_separator = ", ";  // json.dumps' default separators
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(value, ensure_ascii=False, ...) as transformers' tojson filter calls it.
std::string to_json(const Value& value, const JsonFormat& format);

// markupsafe's escape of plain text: & < > " ' become &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(const std::string& text);
// markupsafe.escape(value): a Markup stays as it is, anything else is str() and then escaped.
Value escape_to_markup(const Value& value);
// `text` as a Markup when `like` is one, else a plain str: for operations Markup keeps itself through.
Value string_like(const Value& like, std::string text);

// Looks a string key up in a dict; nullptr when absent.
const Value* dict_find(const DictEntries& entries, const Value& key);
// dict.items(): (key, value) tuples in insertion order.
ValueList dict_items_as_tuples(const DictEntries& entries);
// A list or tuple: what Python can index, slice, concatenate and repeat (not a generator or view).
bool is_plain_sequence(const Value& value);

}  // namespace kvchat::jinja
