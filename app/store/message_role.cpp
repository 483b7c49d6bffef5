#include "app/store/message_role.h"

namespace kvchat::app {

QString role_name(MessageRole role) {
  switch (role) {
    case MessageRole::System: return QStringLiteral("system");
    case MessageRole::User: return QStringLiteral("user");
    case MessageRole::Assistant: return QStringLiteral("assistant");
    case MessageRole::Tool: return QStringLiteral("tool");
    case MessageRole::Marker: return QStringLiteral("marker");
  }
  return QString();
}

std::optional<MessageRole> parse_message_role(const QString& name) {
  for (MessageRole role :
       {MessageRole::System, MessageRole::User, MessageRole::Assistant, MessageRole::Tool, MessageRole::Marker})
    if (name == role_name(role)) return role;
  return std::nullopt;
}

}  // namespace kvchat::app
