#pragma once
// Who a stored message is from. The store, the archive and the exports spell it as text ("system",
// "user", "assistant", "tool", "marker"); everything else compares the enum.
#include <QString>

#include <optional>

namespace kvchat::app {

enum class MessageRole {
  System,
  User,
  Assistant,
  Tool,    // a tool's result, answering one of an assistant message's tool calls (MessageRecord::tool_call_id)
  Marker,  // not a message: where old turns were dropped at the context limit
};

QString role_name(MessageRole role);  // as stored: "system", "user", "assistant", "tool", "marker"
std::optional<MessageRole> parse_message_role(const QString& name);  // nullopt: not one of those five

}  // namespace kvchat::app
