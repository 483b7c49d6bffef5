#include "app/store/tool_use.h"

#include <algorithm>

#include <QJsonDocument>
#include <QStringList>

namespace kvchat::app {

void insert_tool_use(QJsonObject& item, const MessageRecord& message) {
  if (!message.tool_calls.isEmpty()) item.insert(QStringLiteral("tool_calls"), message.tool_calls);
  if (!message.tool_call_id.isEmpty()) item.insert(QStringLiteral("tool_call_id"), message.tool_call_id);
  if (!message.tool_name.isEmpty()) item.insert(QStringLiteral("name"), message.tool_name);
}

namespace {

QString call_problem(const QJsonValue& call, qsizetype index) {
  const QString where = QStringLiteral("tool call %1").arg(index + 1);
  if (!call.isObject()) return where + QStringLiteral(" is not an object");
  const QJsonObject object = call.toObject();
  if (!object.value(QLatin1String("id")).isString()) return where + QStringLiteral(" has no \"id\" text");
  const QJsonValue type = object.value(QLatin1String("type"));
  if (!type.isUndefined() && type.toString() != QLatin1String("function"))
    return where + QStringLiteral(" is not of type \"function\"");
  const QJsonValue function = object.value(QLatin1String("function"));
  if (!function.isObject()) return where + QStringLiteral(" has no \"function\" object");
  const QJsonValue name = function.toObject().value(QLatin1String("name"));
  if (!name.isString() || name.toString().isEmpty()) return where + QStringLiteral(" has no function name");
  if (!function.toObject().value(QLatin1String("arguments")).isString())
    return where + QStringLiteral(" has no \"arguments\" text (the arguments are JSON written as text)");
  return {};
}

}  // namespace

QString read_tool_use(const QJsonObject& item, MessageRecord& message) {
  const QJsonValue calls = item.value(QLatin1String("tool_calls"));
  if (!calls.isUndefined() && !calls.isNull()) {
    if (message.role != MessageRole::Assistant)
      return QStringLiteral("\"tool_calls\" on a message that is not the assistant's");
    if (!calls.isArray()) return QStringLiteral("\"tool_calls\" is not an array");
    const QJsonArray array = calls.toArray();
    for (qsizetype i = 0; i < array.size(); ++i)
      if (const QString problem = call_problem(array[i], i); !problem.isEmpty()) return problem;
    QJsonArray normalized;  // "type" is optional on input, always written
    for (const QJsonValue& call : array) {
      QJsonObject object = call.toObject();
      object.insert(QStringLiteral("type"), QStringLiteral("function"));
      normalized.append(object);
    }
    message.tool_calls = normalized;
  }
  for (const auto& [key, field] :
       {std::pair{"tool_call_id", &message.tool_call_id}, std::pair{"name", &message.tool_name}}) {
    const QJsonValue value = item.value(QLatin1String(key));
    if (value.isUndefined() || value.isNull()) continue;
    if (message.role != MessageRole::Tool)
      return QStringLiteral("\"%1\" on a message that is not a tool result").arg(QLatin1String(key));
    if (!value.isString()) return QStringLiteral("\"%1\" is not text").arg(QLatin1String(key));
    *field = value.toString();
  }
  return {};
}

ToolCallView tool_call_view(const QJsonValue& call) {
  const QJsonObject object = call.toObject();
  const QJsonObject function = object.value(QLatin1String("function")).toObject();
  ToolCallView view;
  view.id = object.value(QLatin1String("id")).toString();
  view.name = function.value(QLatin1String("name")).toString();
  view.arguments = function.value(QLatin1String("arguments")).toString();
  QJsonParseError error{};
  const QJsonDocument parsed = QJsonDocument::fromJson(view.arguments.toUtf8(), &error);
  if (error.error == QJsonParseError::NoError && (parsed.isObject() || parsed.isArray()))
    view.arguments = QString::fromUtf8(parsed.toJson(QJsonDocument::Indented)).trimmed();
  return view;
}

QString tool_result_details(const MessageRecord& message) {
  QStringList parts;
  if (!message.tool_name.isEmpty()) parts << message.tool_name;
  if (!message.tool_call_id.isEmpty()) parts << QStringLiteral("call %1").arg(message.tool_call_id);
  return parts.join(QStringLiteral(", "));
}

QString code_fence_for(const QString& text) {
  int longest = 0, run = 0;
  for (const QChar character : text) {
    run = character == QLatin1Char('`') ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return QString(std::max(3, longest + 1), QLatin1Char('`'));
}

namespace {

QString markdown_code_block(const QString& text, const QString& language) {
  const QString fence = code_fence_for(text);
  return QStringLiteral("%1%2\n%3\n%1\n").arg(fence, language, text);
}

}  // namespace

QString tool_result_markdown(const MessageRecord& message) {
  QString out;
  const QString details = tool_result_details(message);
  if (!details.isEmpty()) out += QStringLiteral("*%1*\n\n").arg(details.toHtmlEscaped());
  return out + markdown_code_block(message.text, QString());
}

QString tool_calls_markdown(const MessageRecord& message) {
  QString out;
  for (const QJsonValue& call : message.tool_calls) {
    const ToolCallView view = tool_call_view(call);
    if (!out.isEmpty()) out += QLatin1Char('\n');
    out += QStringLiteral("**Tool call** `%1` (call `%2`):\n\n").arg(view.name, view.id);
    out += markdown_code_block(view.arguments, QStringLiteral("json"));
  }
  return out;
}

}  // namespace kvchat::app
