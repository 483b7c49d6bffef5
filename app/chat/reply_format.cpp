#include "app/chat/reply_format.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "engine/text/constraint/json_grammar.h"

namespace kvchat::app {

QJsonObject ReplyFormat::to_json() const {
  switch (kind) {
    case Kind::Text: return {};
    case Kind::JsonObject: return QJsonObject{{"type", "json_object"}};
    case Kind::JsonSchema: return QJsonObject{{"type", "json_schema"}, {"schema", schema}};
  }
  return {};
}

ReplyFormat ReplyFormat::from_json(const QJsonObject& json) {
  ReplyFormat format;
  if (json.isEmpty()) return format;
  const QString type = json.value(QLatin1String("type")).toString();
  if (type == QLatin1String("text")) return format;
  if (type == QLatin1String("json_object")) {
    format.kind = Kind::JsonObject;
    return format;
  }
  if (type != QLatin1String("json_schema"))
    throw std::invalid_argument("reply format: 'type' must be \"text\", \"json_object\" or \"json_schema\"");
  const QJsonValue schema = json.value(QLatin1String("schema"));
  if (!schema.isString()) throw std::invalid_argument("reply format: 'schema' is not the schema's JSON text");
  format.kind = Kind::JsonSchema;
  format.schema = schema.toString();
  return format;
}

std::shared_ptr<const JsonGrammar> ReplyFormat::grammar() const {
  switch (kind) {
    case Kind::Text: return nullptr;
    case Kind::JsonObject: return std::make_shared<const JsonGrammar>(any_json_object_grammar());
    case Kind::JsonSchema: {
      const std::string text = schema.toStdString();
      return std::make_shared<const JsonGrammar>(compile_json_schema(std::string_view(text)));
    }
  }
  return nullptr;
}

QString ReplyFormat::problem() const {
  try {
    grammar();
  } catch (const SchemaError& error) {
    return QString::fromStdString(error.what());
  }
  return {};
}

std::string ReplyFormat::response_format() const {
  switch (kind) {
    case Kind::Text: return {};
    case Kind::JsonObject: return R"({"type":"json_object"})";
    case Kind::JsonSchema: {
      nlohmann::ordered_json format{{"type", "json_schema"}};
      format["json_schema"] = {{"name", "reply"}, {"strict", true}};
      format["json_schema"]["schema"] = nlohmann::ordered_json::parse(schema.toStdString());
      return format.dump();
    }
  }
  return {};
}

}  // namespace kvchat::app
