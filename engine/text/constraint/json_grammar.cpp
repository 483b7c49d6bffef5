#include "engine/text/constraint/json_grammar.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace kvchat {
void add_any_containers(JsonGrammar& grammar);

namespace {

using json = nlohmann::ordered_json;
using Node = JsonGrammarNode;

// Keywords that say what a value is for, not what it may be.
const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> keywords = {
      "$schema", "$id",     "$comment", "$anchor",   "title",      "description",      "default",        "examples",
      "format",  "example", "readOnly", "writeOnly", "deprecated", "contentMediaType", "contentEncoding"};
  return keywords;
}

std::string pointer_token(const std::string& key) {
  std::string escaped;
  for (char c : key) {
    if (c == '~')
      escaped += "~0";
    else if (c == '/')
      escaped += "~1";
    else
      escaped += c;
  }
  return escaped;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& document) : document_(document) {}

  JsonGrammar compile() {
    JsonGrammar grammar;
    grammar.root = node_for(document_, "");
    grammar.nodes = std::move(nodes_);
    add_any_containers(grammar);
    return grammar;
  }

 private:
  int add(Node node) {
    nodes_.push_back(std::move(node));
    return static_cast<int>(nodes_.size()) - 1;
  }

  // Schemas nest at most this deep: a hostile one nested 100,000 levels would otherwise overflow the stack.
  static constexpr int kMaxDepth = 128;

  // The node of the schema at `path` (a $ref's target is compiled once, so recursive schemas work).
  int node_for(const json& schema, const std::string& path) {
    struct DepthGuard {
      int& depth;
      explicit DepthGuard(int& d) : depth(d) { ++depth; }
      ~DepthGuard() { --depth; }
    } guard(depth_);
    if (depth_ > kMaxDepth)
      throw SchemaError(path.substr(0, 200) + "...",
                        "the schema nests deeper than " + std::to_string(kMaxDepth) + " levels");
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) throw SchemaError(path, "the schema false allows no value");
      return add(Node{});
    }
    if (!schema.is_object()) throw SchemaError(path, "a schema must be an object or a boolean");
    if (auto ref = schema.find("$ref"); ref != schema.end()) {
      if (schema.size() > 1 + count_annotations(schema))
        throw SchemaError(path, "$ref beside other constraining keywords is not supported");
      return reference(*ref, path);
    }
    check_keywords(schema, path);
    if (auto one_of = schema.find("oneOf"); one_of != schema.end()) return single_branch(*one_of, path + "/oneOf");
    if (auto all_of = schema.find("allOf"); all_of != schema.end()) return single_branch(*all_of, path + "/allOf");
    if (auto any_of = schema.find("anyOf"); any_of != schema.end()) {
      if (!any_of->is_array() || any_of->empty()) throw SchemaError(path + "/anyOf", "anyOf must be a non-empty array");
      Node node;
      node.kind = Node::Kind::AnyOf;
      const int index = add(node);
      std::vector<int> alternatives;
      for (std::size_t i = 0; i < any_of->size(); ++i)
        alternatives.push_back(node_for((*any_of)[i], path + "/anyOf/" + std::to_string(i)));
      nodes_[static_cast<std::size_t>(index)].alternatives = std::move(alternatives);
      return index;
    }
    if (auto const_value = schema.find("const"); const_value != schema.end()) {
      Node node;
      node.kind = Node::Kind::Literals;
      node.literals.push_back(const_value->dump());
      return add(node);
    }
    if (auto values = schema.find("enum"); values != schema.end()) {
      if (!values->is_array() || values->empty()) throw SchemaError(path + "/enum", "enum must be a non-empty array");
      Node node;
      node.kind = Node::Kind::Literals;
      for (const json& value : *values) node.literals.push_back(value.dump());
      return add(node);
    }
    auto type = schema.find("type");
    if (type == schema.end()) return typed(schema, path, infer_type(schema));
    if (type->is_string()) return typed(schema, path, type->get<std::string>());
    if (type->is_array() && !type->empty()) {
      Node node;
      node.kind = Node::Kind::AnyOf;
      const int index = add(node);
      std::vector<int> alternatives;
      for (const json& name : *type) {
        if (!name.is_string()) throw SchemaError(path + "/type", "type must be a string or an array of strings");
        alternatives.push_back(typed(schema, path, name.get<std::string>()));
      }
      nodes_[static_cast<std::size_t>(index)].alternatives = std::move(alternatives);
      return index;
    }
    throw SchemaError(path + "/type", "type must be a string or a non-empty array of strings");
  }

  static std::size_t count_annotations(const json& schema) {
    std::size_t count = 0;
    for (auto it = schema.begin(); it != schema.end(); ++it)
      if (annotation_keywords().count(it.key()) || it.key() == "$defs" || it.key() == "definitions") ++count;
    return count;
  }

  // Refuses what would constrain the value in a way this grammar cannot follow.
  static void check_keywords(const json& schema, const std::string& path) {
    static const std::set<std::string> understood = {"type",
                                                     "properties",
                                                     "required",
                                                     "additionalProperties",
                                                     "items",
                                                     "minItems",
                                                     "maxItems",
                                                     "enum",
                                                     "const",
                                                     "anyOf",
                                                     "oneOf",
                                                     "allOf",
                                                     "minLength",
                                                     "maxLength",
                                                     "minimum",
                                                     "maximum",
                                                     "$defs",
                                                     "definitions",
                                                     "exclusiveMinimum",
                                                     "exclusiveMaximum"};
    for (auto it = schema.begin(); it != schema.end(); ++it)
      if (!understood.count(it.key()) && !annotation_keywords().count(it.key()))
        throw SchemaError(path + "/" + pointer_token(it.key()),
                          "the keyword '" + it.key() + "' is not supported by constrained decoding");
  }

  static std::string infer_type(const json& schema) {
    if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required"))
      return "object";
    if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems")) return "array";
    if (schema.contains("minLength") || schema.contains("maxLength")) return "string";
    if (schema.contains("minimum") || schema.contains("maximum") || schema.contains("exclusiveMinimum") ||
        schema.contains("exclusiveMaximum"))
      return "number";
    return "any";
  }

  int single_branch(const json& branches, const std::string& path) {
    if (!branches.is_array() || branches.size() != 1)
      throw SchemaError(path, "only a single-branch " + path.substr(path.rfind('/') + 1) +
                                  " is supported (use anyOf for alternatives)");
    return node_for(branches[0], path + "/0");
  }

  int reference(const json& ref, const std::string& path) {
    if (!ref.is_string()) throw SchemaError(path + "/$ref", "$ref must be a string");
    const std::string target = ref.get<std::string>();
    if (auto known = references_.find(target); known != references_.end()) return known->second;
    const json* schema = nullptr;
    if (target == "#") {
      schema = &document_;
    } else {
      for (const std::string prefix : {"#/$defs/", "#/definitions/"}) {
        if (target.rfind(prefix, 0) != 0) continue;
        const std::string section = prefix.substr(2, prefix.size() - 3);
        const std::string name = target.substr(prefix.size());
        auto defs = document_.find(section);
        if (defs != document_.end() && defs->is_object() && defs->contains(name)) schema = &(*defs)[name];
      }
    }
    if (!schema) throw SchemaError(path + "/$ref", "$ref '" + target + "' does not name a definition of this schema");
    // An AnyOf of one branch stands in for the target while it is compiled, so a reference back to it ends.
    Node placeholder;
    placeholder.kind = Node::Kind::AnyOf;
    const int index = add(placeholder);
    references_[target] = index;
    const int compiled = node_for(*schema, target.substr(1));
    nodes_[static_cast<std::size_t>(index)].alternatives = {compiled};
    return index;
  }

  static std::int64_t count(const json& schema, const char* keyword, const std::string& path) {
    const json& value = schema[keyword];
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0)
      throw SchemaError(path + "/" + keyword, std::string(keyword) + " must be a non-negative integer");
    return value.get<std::int64_t>();
  }

  static double bound(const json& value, const std::string& path) {
    if (!value.is_number()) throw SchemaError(path, "a bound must be a number");
    return value.get<double>();
  }

  int typed(const json& schema, const std::string& path, const std::string& type) {
    Node node;
    if (type == "any") return add(node);
    if (type == "null") {
      node.kind = Node::Kind::Null;
    } else if (type == "boolean") {
      node.kind = Node::Kind::Boolean;
    } else if (type == "string") {
      node.kind = Node::Kind::String;
      if (schema.contains("minLength")) node.min_length = count(schema, "minLength", path);
      if (schema.contains("maxLength")) node.max_length = count(schema, "maxLength", path);
      if (node.min_length > node.max_length) throw SchemaError(path, "minLength is above maxLength");
    } else if (type == "number" || type == "integer") {
      node.kind = type == "number" ? Node::Kind::Number : Node::Kind::Integer;
      numeric_bounds(schema, path, node);
    } else if (type == "array") {
      node.kind = Node::Kind::Array;
      if (schema.contains("minItems")) node.min_items = count(schema, "minItems", path);
      if (schema.contains("maxItems")) node.max_items = count(schema, "maxItems", path);
      if (node.min_items > node.max_items) throw SchemaError(path, "minItems is above maxItems");
      const int index = add(node);
      int items = -1;
      if (auto it = schema.find("items"); it != schema.end()) {
        if (it->is_array()) throw SchemaError(path + "/items", "items as an array (tuples) is not supported");
        items = node_for(*it, path + "/items");
      } else {
        items = add(Node{});
      }
      nodes_[static_cast<std::size_t>(index)].items = items;
      return index;
    } else if (type == "object") {
      return object(schema, path);
    } else {
      throw SchemaError(path + "/type", "unknown type '" + type + "'");
    }
    return add(node);
  }

  static void numeric_bounds(const json& schema, const std::string& path, Node& node) {
    const auto set_lower = [&](double value, bool exclusive) {
      if (!node.has_minimum || value > node.minimum || (value == node.minimum && exclusive)) {
        node.minimum = value;
        node.exclusive_minimum = exclusive;
      }
      node.has_minimum = true;
    };
    const auto set_upper = [&](double value, bool exclusive) {
      if (!node.has_maximum || value < node.maximum || (value == node.maximum && exclusive)) {
        node.maximum = value;
        node.exclusive_maximum = exclusive;
      }
      node.has_maximum = true;
    };
    if (schema.contains("minimum")) set_lower(bound(schema["minimum"], path + "/minimum"), false);
    if (schema.contains("maximum")) set_upper(bound(schema["maximum"], path + "/maximum"), false);
    // draft 2020-12: a number; draft-04's boolean form modifies minimum/maximum.
    for (const auto& [keyword, lower] : {std::pair{"exclusiveMinimum", true}, std::pair{"exclusiveMaximum", false}}) {
      if (!schema.contains(keyword)) continue;
      const json& value = schema[keyword];
      if (value.is_boolean()) {
        if (value.get<bool>()) {
          if (lower && node.has_minimum) node.exclusive_minimum = true;
          if (!lower && node.has_maximum) node.exclusive_maximum = true;
        }
        continue;
      }
      const double limit = bound(value, path + "/" + keyword);
      if (lower)
        set_lower(limit, true);
      else
        set_upper(limit, true);
    }
    if (node.has_minimum && node.has_maximum &&
        (node.minimum > node.maximum ||
         (node.minimum == node.maximum && (node.exclusive_minimum || node.exclusive_maximum))))
      throw SchemaError(path, "the bounds leave no number");
  }

  int object(const json& schema, const std::string& path) {
    Node node;
    node.kind = Node::Kind::Object;
    const int index = add(node);
    std::set<std::string> required;
    if (auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) throw SchemaError(path + "/required", "required must be an array of strings");
      for (const json& name : *it) {
        if (!name.is_string()) throw SchemaError(path + "/required", "required must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    std::vector<Node::Property> properties;
    if (auto it = schema.find("properties"); it != schema.end()) {
      if (!it->is_object()) throw SchemaError(path + "/properties", "properties must be an object");
      // The schema's own order: the reply writes the properties as the schema lists them.
      for (auto property = it->begin(); property != it->end(); ++property) {
        const std::string key = json(property.key()).dump();
        Node::Property entry;
        entry.key = key.substr(1, key.size() - 2);
        entry.required = required.count(property.key()) > 0;
        entry.node = node_for(property.value(), path + "/properties/" + pointer_token(property.key()));
        properties.push_back(std::move(entry));
      }
    }
    for (const std::string& name : required) {
      const bool listed = std::any_of(properties.begin(), properties.end(), [&](const Node::Property& property) {
        return property.key == json(name).dump().substr(1, json(name).dump().size() - 2);
      });
      if (!listed) throw SchemaError(path + "/required", "required property '" + name + "' is not in properties");
    }
    if (properties.size() > 64) throw SchemaError(path + "/properties", "more than 64 properties");
    int additional = add(Node{});
    if (auto it = schema.find("additionalProperties"); it != schema.end()) {
      if (it->is_boolean() && !it->get<bool>())
        additional = -1;
      else
        additional = node_for(*it, path + "/additionalProperties");
    }
    Node& compiled = nodes_[static_cast<std::size_t>(index)];
    compiled.properties = std::move(properties);
    compiled.additional = additional;
    return index;
  }

  const json& document_;
  int depth_ = 0;
  std::vector<Node> nodes_;
  std::map<std::string, int> references_;
};

}  // namespace

void add_any_containers(JsonGrammar& grammar) {
  const int any = static_cast<int>(grammar.nodes.size());
  grammar.nodes.push_back(Node{});
  Node object;
  object.kind = Node::Kind::Object;
  object.additional = any;
  grammar.any_object = static_cast<int>(grammar.nodes.size());
  grammar.nodes.push_back(object);
  Node array;
  array.kind = Node::Kind::Array;
  array.items = any;
  grammar.any_array = static_cast<int>(grammar.nodes.size());
  grammar.nodes.push_back(array);
}

JsonGrammar compile_json_schema(const nlohmann::ordered_json& schema) { return SchemaCompiler(schema).compile(); }

JsonGrammar compile_json_schema(std::string_view schema_text) {
  json schema;
  try {
    schema = json::parse(schema_text);
  } catch (const json::exception& error) {
    throw SchemaError("", std::string("the schema is not valid JSON: ") + error.what());
  }
  return compile_json_schema(schema);
}

JsonGrammar any_json_object_grammar() {
  JsonGrammar grammar;
  add_any_containers(grammar);
  grammar.root = grammar.any_object;
  return grammar;
}

JsonGrammar join_grammars(const std::vector<JsonGrammar>& grammars) {
  if (grammars.empty()) throw std::invalid_argument("join_grammars: no grammar to join");
  JsonGrammar joined;
  for (const JsonGrammar& grammar : grammars) {
    const int offset = static_cast<int>(joined.nodes.size());
    const auto moved = [offset](int node) { return node < 0 ? node : node + offset; };
    for (JsonGrammarNode node : grammar.nodes) {
      for (JsonGrammarNode::Property& property : node.properties) property.node = moved(property.node);
      node.additional = moved(node.additional);
      node.items = moved(node.items);
      for (int& alternative : node.alternatives) alternative = moved(alternative);
      joined.nodes.push_back(std::move(node));
    }
    // Every grammar's Any nodes read the joined grammar's any-object and any-array, which are built alike.
    if (joined.any_object < 0) joined.any_object = moved(grammar.any_object);
    if (joined.any_array < 0) joined.any_array = moved(grammar.any_array);
    for (int index = 0; index < grammar.branch_count(); ++index) {
      const JsonGrammar::BranchView view = grammar.branch(index);
      JsonGrammar::Branch branch{view.prefix, moved(view.root), view.suffix};
      if (&grammar == &grammars.front() && index == 0) {
        joined.prefix = branch.prefix;
        joined.root = branch.root;
        joined.suffix = branch.suffix;
      } else {
        joined.more_branches.push_back(std::move(branch));
      }
    }
  }
  return joined;
}

}  // namespace kvchat
