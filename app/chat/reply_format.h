#pragma once
// A chat's reply format: free text, any JSON object, or a JSON value valid against a schema the user gave. A
// JSON format constrains a local reply token by token (engine/text/constraint/) and is asked of a server as
// OpenAI's `response_format`. The schema is kept as the user wrote it: its properties come in its order.
#include <QJsonObject>
#include <QString>

#include <memory>
#include <string>

namespace kvchat {
struct JsonGrammar;
}

namespace kvchat::app {

struct ReplyFormat {
  enum class Kind { Text, JsonObject, JsonSchema };
  Kind kind = Kind::Text;
  QString schema;  // JsonSchema: the schema's JSON text

  bool is_text() const { return kind == Kind::Text; }
  bool operator==(const ReplyFormat& other) const { return kind == other.kind && schema == other.schema; }

  // {} for free text, {"type": "json_object"}, or {"type": "json_schema", "schema": "<the schema's text>"}.
  QJsonObject to_json() const;
  // Throws std::invalid_argument naming what is wrong (an unknown type, a schema that is not text).
  static ReplyFormat from_json(const QJsonObject& json);

  // What a reply may be; nullptr for free text. Throws kvchat::SchemaError naming the part of the schema the
  // constraint cannot take, or that is not JSON.
  std::shared_ptr<const JsonGrammar> grammar() const;
  // The same check, as text: "" when grammar() would succeed.
  QString problem() const;
  // OpenAI's `response_format` for it as JSON text, the schema's properties in their order ("" for free text).
  std::string response_format() const;
};

}  // namespace kvchat::app
