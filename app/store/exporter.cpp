#include "app/store/exporter.h"

#include <spdlog/spdlog.h>

#include <stdexcept>

#include <QDir>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QPair>
#include <QSaveFile>
#include <QStringList>

#include "app/store/chat_history.h"
#include "app/store/markdown_text.h"
#include "app/store/message_stats_json.h"
#include "app/store/tool_use.h"

namespace kvchat::app {

namespace {

QString role_label(MessageRole role) {
  switch (role) {
    case MessageRole::System: return QStringLiteral("System");
    case MessageRole::User: return QStringLiteral("User");
    case MessageRole::Assistant: return QStringLiteral("Assistant");
    case MessageRole::Tool: return QStringLiteral("Tool result");
    case MessageRole::Marker: return QStringLiteral("Marker");
  }
  return QString();
}

QString timestamp(const QDateTime& time) {
  return time.isValid() ? time.toUTC().toString(Qt::ISODateWithMs) : QString();
}

// "model · stats" (a server's reply: "model on URL · stats") under a reply; empty when there is nothing to say. A
// failed reply has no figures to show (its error is written instead, see failure_line).
QString reply_footer(const MessageRecord& message) {
  QStringList parts;
  const bool remote = !message.backend.isEmpty() && message.backend != QLatin1String("local");
  if (!message.model.isEmpty())
    parts << (remote ? QStringLiteral("%1 on %2").arg(message.model, message.backend) : message.model);
  const QString summary = is_failed_reply(message) ? QString() : stats_summary(message.stats);
  if (!summary.isEmpty()) parts << summary;
  return parts.join(QStringLiteral(" · "));
}

QString failure_line(const MessageRecord& message) {
  return QStringLiteral("Failed: %1 (this turn is left out of what the model sees)").arg(reply_error(message));
}

QString prefix_lines(const QString& text, const QString& prefix) {
  QStringList lines = text.split(QLatin1Char('\n'));
  for (QString& line : lines) line.prepend(prefix);
  return lines.join(QLatin1Char('\n'));
}

// A turn's replies that the chat does not show (kept by Regenerate), each with its number among all the
// turn's replies, oldest first.
struct OtherVersions {
  QList<QPair<int, MessageRecord>> versions;
  int count = 0;         // the turn's replies, the shown one included
  int shown_number = 0;  // the shown reply's number; 0 when the turn shows none
};

// For a shown reply: the rest of its turn. For a user message whose turn has replies but shows none of
// them (a Regenerate whose new reply was never written): all of them. Otherwise nothing.
OtherVersions other_versions(const QList<MessageRecord>& messages, const MessageRecord& message) {
  OtherVersions result;
  QList<MessageRecord> turn;
  if (message.role == MessageRole::Assistant && !is_hidden_alternative(message)) {
    const QList<qint64> ids = reply_alternatives(messages, message.id);
    for (const MessageRecord& record : messages)
      if (ids.contains(record.id)) turn.push_back(record);
  } else if (message.role == MessageRole::User) {
    bool after = false;
    for (const MessageRecord& record : messages) {
      if (record.id == message.id) {
        after = true;
      } else if (after && (record.role == MessageRole::User || record.role == MessageRole::Tool)) {
        break;
      } else if (after && record.role == MessageRole::Assistant) {
        if (!is_hidden_alternative(record)) return result;  // shown with its reply
        turn.push_back(record);
      }
    }
  }
  result.count = static_cast<int>(turn.size());
  for (int i = 0; i < turn.size(); ++i) {
    if (is_hidden_alternative(turn[i]))
      result.versions.push_back({i + 1, turn[i]});
    else
      result.shown_number = i + 1;
  }
  return result;
}

QString other_version_note(const OtherVersions& others) {
  return others.shown_number > 0
             ? QStringLiteral("Kept by Regenerate; the chat shows version %1, and only that one is given to the model.")
                   .arg(others.shown_number)
             : QStringLiteral("Kept by Regenerate; the chat shows no version of this reply.");
}

// A message's text and what follows it (its tool calls, its error, "incomplete", its model and figures),
// Markdown.
QString markdown_body(const MessageRecord& message) {
  QString out;
  if (message.role == MessageRole::Tool)
    out += tool_result_markdown(message);
  else if (!message.text.isEmpty())
    out += markdown_with_hard_line_breaks(message.text) + QLatin1Char('\n');
  if (!out.isEmpty() && !message.tool_calls.isEmpty()) out += QLatin1Char('\n');
  out += tool_calls_markdown(message);
  if (is_failed_reply(message))
    out += QStringLiteral("%1**%2**\n")
               .arg(message.text.isEmpty() ? QString() : QStringLiteral("\n"), failure_line(message).toHtmlEscaped());
  if (!message.complete) out += QStringLiteral("\n*(incomplete)*\n");
  if (message.role == MessageRole::Assistant) {
    const QString footer = reply_footer(message);
    if (!footer.isEmpty()) out += QStringLiteral("\n<sub>%1</sub>\n").arg(footer.toHtmlEscaped());
  }
  return out;
}

QString markdown_other_versions(const OtherVersions& others) {
  QString out;
  for (const auto& [number, reply] : others.versions) {
    out += QStringLiteral("\n### Other version %1 of %2 of this reply\n\n*%3*\n\n")
               .arg(number)
               .arg(others.count)
               .arg(other_version_note(others));
    out += markdown_body(reply);
  }
  return out;
}

// The same in plain text.
QString text_body(const MessageRecord& message) {
  QString out;
  if (message.role == MessageRole::Tool && !tool_result_details(message).isEmpty())
    out += QStringLiteral("(%1)\n").arg(tool_result_details(message));
  if (!(message.text.isEmpty() && (is_failed_reply(message) || !message.tool_calls.isEmpty())))
    out += message.text + QLatin1Char('\n');
  for (const QJsonValue& call : message.tool_calls) {
    const ToolCallView view = tool_call_view(call);
    out += QStringLiteral("Tool call %1 (call %2):\n%3\n").arg(view.name, view.id, view.arguments);
  }
  if (is_failed_reply(message)) out += failure_line(message) + QLatin1Char('\n');
  if (!message.complete) out += QStringLiteral("(incomplete)\n");
  if (message.role == MessageRole::Assistant) {
    const QString footer = reply_footer(message);
    if (!footer.isEmpty()) out += QStringLiteral("[%1]\n").arg(footer);
  }
  return out;
}

QString text_other_versions(const OtherVersions& others) {
  QString out;
  for (const auto& [number, reply] : others.versions)
    out += QStringLiteral("\nOther version %1 of %2 of this reply (%3):\n%4")
               .arg(number)
               .arg(others.count)
               .arg(other_version_note(others).chopped(1), text_body(reply));
  return out;
}

QString to_markdown(const ConversationRecord& conversation, const QList<MessageRecord>& messages) {
  QString out;
  out += QStringLiteral("# %1\n\n").arg(conversation.title.isEmpty() ? QStringLiteral("Untitled") : conversation.title);
  out += QStringLiteral("- Conversation: %1\n- Created: %2\n- Updated: %3\n")
             .arg(conversation.id)
             .arg(timestamp(conversation.created_at), timestamp(conversation.updated_at));
  if (!conversation.system_prompt.isEmpty())
    out += QStringLiteral("\n**System prompt:**\n\n%1\n")
               .arg(prefix_lines(markdown_with_hard_line_breaks(conversation.system_prompt), QStringLiteral("> ")));
  for (const MessageRecord& message : messages_in_reading_order(messages)) {
    out += QStringLiteral("\n## %1\n\n").arg(role_label(message.role));
    if (message.role == MessageRole::Marker) {
      out += prefix_lines(markdown_with_hard_line_breaks(message.text), QStringLiteral("> ")) + QLatin1Char('\n');
      continue;
    }
    out += markdown_body(message);
    out += markdown_other_versions(other_versions(messages, message));
  }
  return out;
}

QString to_text(const ConversationRecord& conversation, const QList<MessageRecord>& messages) {
  QString out;
  out += (conversation.title.isEmpty() ? QStringLiteral("Untitled") : conversation.title) + QLatin1Char('\n');
  out += QStringLiteral("Created: %1\nUpdated: %2\n")
             .arg(timestamp(conversation.created_at), timestamp(conversation.updated_at));
  if (!conversation.system_prompt.isEmpty())
    out += QStringLiteral("\nSystem prompt:\n%1\n").arg(conversation.system_prompt);
  for (const MessageRecord& message : messages_in_reading_order(messages)) {
    out += QStringLiteral("\n%1:\n").arg(role_label(message.role));
    out += text_body(message);
    out += text_other_versions(other_versions(messages, message));
  }
  return out;
}

QJsonObject message_json(const MessageRecord& message) {
  QJsonObject item;
  item.insert(QStringLiteral("id"), message.id);
  item.insert(QStringLiteral("role"), role_name(message.role));
  item.insert(QStringLiteral("text"), message.text);
  item.insert(QStringLiteral("created_at"), timestamp(message.created_at));
  item.insert(QStringLiteral("model"), message.model);
  if (!message.backend.isEmpty()) item.insert(QStringLiteral("backend"), message.backend);  // "local" or a server
  item.insert(QStringLiteral("settings"), message.settings);
  item.insert(QStringLiteral("stats"), message.stats);
  item.insert(QStringLiteral("complete"), message.complete);
  if (is_failed_reply(message)) item.insert(QStringLiteral("error"), reply_error(message));
  insert_tool_use(item, message);
  return item;
}

// The chat as it reads, each reply with the other replies of its turn ("alternatives", oldest first); a turn
// that shows none of its replies has them as messages of their own after its user message (their settings
// say hidden_alternative).
QString to_json(const ConversationRecord& conversation, const QList<MessageRecord>& messages) {
  QJsonObject root;
  root.insert(QStringLiteral("id"), conversation.id);
  root.insert(QStringLiteral("title"), conversation.title);
  root.insert(QStringLiteral("system_prompt"), conversation.system_prompt);
  // Absent when the chat follows the global settings (each reply's "settings" says what it was given).
  if (!conversation.generation_settings.isEmpty())
    root.insert(QStringLiteral("generation_settings"), conversation.generation_settings);
  // Absent when the chat's replies are free text.
  if (!conversation.reply_format.isEmpty()) root.insert(QStringLiteral("reply_format"), conversation.reply_format);
  root.insert(QStringLiteral("created_at"), timestamp(conversation.created_at));
  root.insert(QStringLiteral("updated_at"), timestamp(conversation.updated_at));
  QJsonArray items;
  for (const MessageRecord& message : messages_in_reading_order(messages)) {
    QJsonObject item = message_json(message);
    const OtherVersions others = other_versions(messages, message);
    if (message.role == MessageRole::Assistant) {
      QJsonArray alternatives;
      for (const auto& [number, reply] : others.versions) alternatives.append(message_json(reply));
      item.insert(QStringLiteral("alternatives"), alternatives);
    }
    items.append(item);
    if (message.role == MessageRole::User)
      for (const auto& [number, reply] : others.versions) items.append(message_json(reply));
  }
  root.insert(QStringLiteral("messages"), items);
  return QString::fromUtf8(QJsonDocument(root).toJson(QJsonDocument::Indented));
}

}  // namespace

ExportFormat export_format_from_string(const QString& text) {
  const QString key = text.trimmed().toLower();
  if (key == QLatin1String("md") || key == QLatin1String("markdown")) return ExportFormat::Markdown;
  if (key == QLatin1String("json")) return ExportFormat::Json;
  if (key == QLatin1String("txt") || key == QLatin1String("text")) return ExportFormat::Text;
  throw std::invalid_argument("unknown export format '" + text.toStdString() + "' (expected md, json or txt)");
}

ExportContents export_contents(const QList<MessageRecord>& all_messages) {
  const QList<MessageRecord> messages = messages_on_shown_path(all_messages);
  ExportContents contents;
  contents.messages = static_cast<int>(messages_in_reading_order(messages).size());
  for (const MessageRecord& message : messages)
    if (is_hidden_alternative(message)) ++contents.other_versions;
  return contents;
}

QString export_conversation(const ConversationRecord& conversation, const QList<MessageRecord>& all_messages,
                            ExportFormat format) {
  // The conversation is its shown path: the branches it does not show are not part of it here.
  const QList<MessageRecord> messages = messages_on_shown_path(all_messages);
  switch (format) {
    case ExportFormat::Markdown: return to_markdown(conversation, messages);
    case ExportFormat::Json: return to_json(conversation, messages);
    case ExportFormat::Text: return to_text(conversation, messages);
  }
  throw std::invalid_argument("unknown export format");
}

namespace {

// Devices and pipes (/dev/stdout, a FIFO) cannot be replaced by renaming: QSaveFile would put a regular
// file in their place. They are written straight through, and their errors still reported.
void write_to_special_file(const QString& path, const QByteArray& bytes) {
  QFile file(path);
  if (!file.open(QIODevice::WriteOnly | QIODevice::Unbuffered))
    throw std::runtime_error("cannot write " + path.toStdString() + ": " + file.errorString().toStdString());
  if (file.write(bytes) != bytes.size() || !file.flush())
    throw std::runtime_error("cannot write " + path.toStdString() + ": " + file.errorString().toStdString());
  file.close();
}

}  // namespace

void write_text_file(const QString& path, const QString& contents) {
  const QFileInfo target(path);
  if (target.isDir()) throw std::runtime_error("cannot write " + path.toStdString() + ": it is a folder");
  if (target.exists() && !target.isFile()) {
    write_to_special_file(path, contents.toUtf8());
    return;
  }
  // QSaveFile writes a temporary beside the target and renames it over the target only once everything
  // is on disk: a full disk or a crash leaves the old file (or none), never half a file.
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly))
    throw std::runtime_error("cannot write " + path.toStdString() + ": " + file.errorString().toStdString());
  const QByteArray bytes = contents.toUtf8();
  if (file.write(bytes) != bytes.size()) {
    const std::string reason = file.errorString().toStdString();
    file.cancelWriting();
    throw std::runtime_error("cannot write " + path.toStdString() + ": " + reason);
  }
  if (!file.commit())
    throw std::runtime_error("cannot write " + path.toStdString() + ": " + file.errorString().toStdString());
  spdlog::debug("wrote {} ({} bytes)", path.toStdString(), bytes.size());
}

}  // namespace kvchat::app
