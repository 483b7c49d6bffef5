#pragma once
// A stored message's tool use (MessageRecord::tool_calls, tool_call_id, tool_name) as the archive, the exports
// and the window write and read it. One set of rules, so an export of an import of an export is the same file.
#include <QJsonArray>
#include <QJsonObject>
#include <QString>

#include "app/store/conversation_store.h"

namespace kvchat::app {

// Adds "tool_calls" (an assistant message that called tools), "tool_call_id" and "name" (a tool result) to a
// message's JSON; nothing for a message without tool use.
void insert_tool_use(QJsonObject& item, const MessageRecord& message);

// Reads the same keys back into `message` (its role already set). Returns what is wrong, "" when nothing is:
// tool calls on a message that is not the assistant's, a call that is not {"id": text, "type": "function",
// "function": {"name": non-empty text, "arguments": text}}, or a call id or tool name on a message that is not
// a tool result.
QString read_tool_use(const QJsonObject& item, MessageRecord& message);

// One call for a reader: its function's name, its id, and its arguments (pretty-printed when they are a JSON
// object or array, else as they were written).
struct ToolCallView {
  QString id;
  QString name;
  QString arguments;
};
ToolCallView tool_call_view(const QJsonValue& call);

// A tool result's heading details: "get_weather, call call_1", "get_weather", "call call_1" or "".
QString tool_result_details(const MessageRecord& message);

// A fence of backticks longer than any run of them in `text`, so the text can sit in a code block as it is.
QString code_fence_for(const QString& text);

// Markdown, for the window and the Markdown export alike. A tool result: its details in italics, then its text
// as a code block (a tool's output is data, not Markdown). An assistant message's tool calls: each call's
// function name and id, then its arguments as a JSON code block; "" when it called none.
QString tool_result_markdown(const MessageRecord& message);
QString tool_calls_markdown(const MessageRecord& message);

}  // namespace kvchat::app
