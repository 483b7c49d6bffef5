#pragma once
// What a constrained reply may be: a JSON value described by a JSON schema (or any JSON object), with an
// optional literal text before and after it (a tool call's "<tool_call>\n" ... "\n</tool_call>").
//
// The schema is compiled once into a flat table of nodes that the byte matcher (json_matcher.h) walks.
// Keywords that only annotate (title, description, default, examples, format, ...) are accepted and
// ignored; keywords that constrain in a way the matcher cannot enforce are refused with a SchemaError
// naming the keyword and where it is, never dropped: a reply must be valid against the schema it was
// asked for.
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvchat {

// A schema the constraint cannot take. `path` is the JSON pointer of the offending part ("/properties/age").
class SchemaError : public std::runtime_error {
 public:
  SchemaError(const std::string& path, const std::string& message)
      : std::runtime_error(path.empty() ? message : path + ": " + message), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct JsonGrammarNode {
  enum class Kind : std::uint8_t {
    Any,  // any JSON value
    Object,
    Array,
    String,
    Number,   // any JSON number
    Integer,  // a number without fraction or exponent
    Boolean,
    Null,
    Literals,  // one of `literals`, each a JSON text (enum, const)
    AnyOf,     // one of `alternatives` (node indexes)
  };
  struct Property {
    std::string key;  // the key as it appears between the quotes: JSON-escaped
    int node = 0;
    bool required = false;
  };
  Kind kind = Kind::Any;
  // Object: properties come in this order (each optional one may be left out); keys not listed are
  // allowed after the last required one when `additional` >= 0 (the node their values follow).
  std::vector<Property> properties;
  int additional = -1;
  // Array: items follow node `items`; their count is within [min_items, max_items].
  int items = -1;
  std::int64_t min_items = 0, max_items = std::numeric_limits<std::int64_t>::max();
  // String: its length in code points is within [min_length, max_length].
  std::int64_t min_length = 0, max_length = std::numeric_limits<std::int64_t>::max();
  // Number, Integer: bounds (inclusive unless exclusive_*); a bounded number is written without exponent.
  bool has_minimum = false, has_maximum = false, exclusive_minimum = false, exclusive_maximum = false;
  double minimum = 0.0, maximum = 0.0;
  std::vector<std::string> literals;
  std::vector<int> alternatives;
};

struct JsonGrammar {
  std::vector<JsonGrammarNode> nodes;  // nodes[root] is the value
  int root = 0;
  // An object and an array of any values: what an Any node's value is when it starts with '{' or '['.
  int any_object = -1, any_array = -1;
  std::string prefix, suffix;  // literal text around the value
  // Other forms a reply may take beside (prefix, root, suffix), each with its own literal text around its own
  // value: a tool call whose function's name is outside its JSON (functionary's <function=NAME>{...}</function>)
  // is one branch per function.
  struct Branch {
    std::string prefix;
    int root = 0;
    std::string suffix;
  };
  std::vector<Branch> more_branches;

  int branch_count() const { return 1 + static_cast<int>(more_branches.size()); }
  // Branch `index` (0: the grammar's own prefix, root and suffix), without copying its text.
  struct BranchView {
    const std::string& prefix;
    int root;
    const std::string& suffix;
  };
  BranchView branch(int index) const {
    if (index == 0) return {prefix, root, suffix};
    const Branch& other = more_branches[static_cast<std::size_t>(index - 1)];
    return {other.prefix, other.root, other.suffix};
  }
};

// One grammar whose branches are those of `grammars`, in order: a reply valid against any one of them is valid
// against it. Their nodes are renumbered into one table. `grammars` must not be empty.
JsonGrammar join_grammars(const std::vector<JsonGrammar>& grammars);

// Compiles a JSON schema (draft 2020-12 and draft-07 keywords: type, properties, required,
// additionalProperties, items, minItems, maxItems, enum, const, anyOf, oneOf with one branch, allOf with one
// branch, $ref to "#", "#/$defs/..." or "#/definitions/...", minLength, maxLength, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum). Throws SchemaError.
// Properties are written in the schema's order, hence an ordered_json.
JsonGrammar compile_json_schema(const nlohmann::ordered_json& schema);
JsonGrammar compile_json_schema(std::string_view schema_text);  // also SchemaError for text that is not JSON
// Any JSON object (OpenAI's response_format json_object).
JsonGrammar any_json_object_grammar();

}  // namespace kvchat
