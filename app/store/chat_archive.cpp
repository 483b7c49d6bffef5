#include "app/store/chat_archive.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>

#include <QFile>
#include <QFileInfo>
#include <QHash>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QJsonValue>

#include "app/store/chat_history.h"
#include "app/store/tool_use.h"

namespace kvchat::app {

// Named, not anonymous: the store's files are compiled in batches (unity build), where another file's
// helpers of the same names would collide.
namespace chat_archive_format {

QString timestamp(const QDateTime& time) {
  return time.isValid() ? time.toUTC().toString(Qt::ISODateWithMs) : QString();
}

[[noreturn]] void fail(const QString& what) { throw ArchiveError(what.toStdString()); }

QString quoted(const QString& text) { return QStringLiteral("\u201c%1\u201d").arg(text); }

// What a JSON value is, for an error ("a string", "an array").
QString kind_of(const QJsonValue& value) {
  switch (value.type()) {
    case QJsonValue::Null: return QStringLiteral("null");
    case QJsonValue::Bool: return QStringLiteral("true or false");
    case QJsonValue::Double: return QStringLiteral("a number");
    case QJsonValue::String: return QStringLiteral("a string");
    case QJsonValue::Array: return QStringLiteral("an array");
    case QJsonValue::Object: return QStringLiteral("an object");
    case QJsonValue::Undefined: break;
  }
  return QStringLiteral("missing");
}

// Reads one object's fields, each error prefixed with where the object is.
class Fields {
 public:
  Fields(const QJsonObject& object, QString where) : object_(object), where_(std::move(where)) {}

  [[noreturn]] void fail_at(const QString& what) const { fail(where_ + QStringLiteral(": ") + what); }

  QString string(const char* key, bool required = false) const {
    const QJsonValue value = object_.value(QLatin1String(key));
    if (value.isUndefined() && !required) return QString();
    if (!value.isString())
      fail_at(QStringLiteral("\"%1\" is %2, not a string").arg(QLatin1String(key), kind_of(value)));
    return value.toString();
  }
  bool boolean(const char* key, bool fallback) const {
    const QJsonValue value = object_.value(QLatin1String(key));
    if (value.isUndefined()) return fallback;
    if (!value.isBool())
      fail_at(QStringLiteral("\"%1\" is %2, not true or false").arg(QLatin1String(key), kind_of(value)));
    return value.toBool();
  }
  QJsonObject object(const char* key) const {
    const QJsonValue value = object_.value(QLatin1String(key));
    if (value.isUndefined()) return {};
    if (!value.isObject())
      fail_at(QStringLiteral("\"%1\" is %2, not an object").arg(QLatin1String(key), kind_of(value)));
    return value.toObject();
  }
  QJsonArray array(const char* key) const {
    const QJsonValue value = object_.value(QLatin1String(key));
    if (!value.isArray()) fail_at(QStringLiteral("\"%1\" is %2, not an array").arg(QLatin1String(key), kind_of(value)));
    return value.toArray();
  }
  // An integer in [low, high]; `fallback` when absent.
  qint64 integer(const char* key, qint64 low, qint64 high, qint64 fallback) const {
    const QJsonValue value = object_.value(QLatin1String(key));
    if (value.isUndefined()) return fallback;
    const double number = value.toDouble();
    if (!value.isDouble() || std::floor(number) != number || number < static_cast<double>(low) ||
        number > static_cast<double>(high))
      fail_at(QStringLiteral("\"%1\" must be a whole number from %2 to %3").arg(QLatin1String(key)).arg(low).arg(high));
    return static_cast<qint64>(number);
  }
  QString tool_use(MessageRecord& message) const { return read_tool_use(object_, message); }
  QDateTime time(const char* key) const {
    const QString text = string(key);
    if (text.isEmpty()) return {};
    QDateTime time = QDateTime::fromString(text, Qt::ISODateWithMs);
    if (!time.isValid())
      fail_at(QStringLiteral("\"%1\" is not a date and time (%2)").arg(QLatin1String(key), quoted(text.left(40))));
    return time.toUTC();
  }

 private:
  QJsonObject object_;
  QString where_;
};

// The fields every message format shares: role, text, times, origin, settings, stats, complete.
MessageRecord common_message(const Fields& fields) {
  MessageRecord message;
  const QString role = fields.string("role", true);
  const std::optional<MessageRole> known = parse_message_role(role);
  if (!known)
    fields.fail_at(QStringLiteral("unknown role %1 (expected system, user, assistant, tool or marker)")
                       .arg(quoted(role.left(40))));
  message.role = *known;
  message.text = fields.string("text", true);
  message.created_at = fields.time("created_at");
  message.model = fields.string("model");
  message.backend = fields.string("backend");
  message.settings = fields.object("settings");
  message.stats = fields.object("stats");
  message.complete = fields.boolean("complete", true);
  if (const QString problem = fields.tool_use(message); !problem.isEmpty()) fields.fail_at(problem);
  return message;
}

QString conversation_place(qsizetype index, const QString& title) {
  return QStringLiteral("conversation %1 (%2)").arg(index + 1).arg(quoted(title.left(60)));
}

ConversationRecord conversation_record(const Fields& fields) {
  ConversationRecord record;
  record.title = fields.string("title", true);
  record.system_prompt = fields.string("system_prompt");
  record.created_at = fields.time("created_at");
  record.updated_at = fields.time("updated_at");
  record.pinned = fields.boolean("pinned", false);
  record.generation_settings = fields.object("generation_settings");  // {} when absent: the global settings
  record.reply_format = fields.object("reply_format");                // {} when absent: free text
  return record;
}

QList<ImportedConversation> parse_archive(const QJsonObject& root) {
  const Fields top(root, QStringLiteral("the archive"));
  const QJsonValue version = root.value(QLatin1String("version"));
  if (!version.isDouble() || version.toDouble() != std::floor(version.toDouble()))
    fail(QStringLiteral("the archive has no version number (\"version\" is %1)").arg(kind_of(version)));
  if (version.toDouble() != kChatArchiveVersion)
    fail(QStringLiteral("the archive is version %1 of the %2 format; this program reads version %3")
             .arg(version.toDouble())
             .arg(QLatin1String(kChatArchiveFormat))
             .arg(kChatArchiveVersion));
  const QJsonArray conversations = top.array("conversations");
  QList<ImportedConversation> result;
  for (qsizetype c = 0; c < conversations.size(); ++c) {
    if (!conversations[c].isObject())
      fail(QStringLiteral("conversation %1 is %2, not an object").arg(c + 1).arg(kind_of(conversations[c])));
    const Fields chat(conversations[c].toObject(), QStringLiteral("conversation %1").arg(c + 1));
    ImportedConversation imported;
    imported.conversation = conversation_record(chat);
    const QString place = conversation_place(c, imported.conversation.title);
    const QJsonArray messages = Fields(conversations[c].toObject(), place).array("messages");
    const qint64 count = messages.size();
    for (qsizetype m = 0; m < messages.size(); ++m) {
      const QString where = QStringLiteral("%1, message %2").arg(place).arg(m + 1);
      if (!messages[m].isObject()) fail(QStringLiteral("%1 is %2, not an object").arg(where, kind_of(messages[m])));
      const Fields fields(messages[m].toObject(), where);
      MessageRecord message = common_message(fields);
      message.id = m + 1;
      // A branch starts at a user message at or before this one; an edit refers to an earlier user message.
      message.branch = fields.integer("branch", 0, m + 1, 0);
      message.forked_from = fields.integer("forked_from", 0, m, 0);
      for (const auto& [key, reference] :
           {std::pair{"branch", message.branch}, std::pair{"forked_from", message.forked_from}})
        if (reference != 0 && reference != message.id && imported.messages[reference - 1].role != MessageRole::User)
          fields.fail_at(QStringLiteral("\"%1\" refers to message %2, which is not a user message")
                             .arg(QLatin1String(key))
                             .arg(reference));
      if (message.branch == message.id && message.role != MessageRole::User)
        fields.fail_at(QStringLiteral("\"branch\" refers to this message, which is not a user message"));
      if (message.role == MessageRole::Marker && messages[m].toObject().contains(QLatin1String("context_starts_at")))
        message.settings.insert(QLatin1String(kMarkerContextStartKey),
                                fields.integer("context_starts_at", 1, count, 1));
      else
        message.settings.remove(QLatin1String(kMarkerContextStartKey));
      if (messages[m].toObject().contains(QLatin1String("token_ids"))) {
        const QJsonArray ids = fields.array("token_ids");
        message.token_ids.reserve(static_cast<std::size_t>(ids.size()));
        for (const QJsonValue& id : ids) {
          const double number = id.toDouble(-1.0);
          if (!id.isDouble() || std::floor(number) != number || number < 0 ||
              number > std::numeric_limits<std::int32_t>::max())
            fields.fail_at(QStringLiteral("\"token_ids\" holds %1, not a token id").arg(kind_of(id)));
          message.token_ids.push_back(static_cast<TokenId>(number));
        }
        bool ok = false;
        message.token_vocabulary = fields.string("token_vocabulary").toULongLong(&ok);
        if (!ok)
          fields.fail_at(
              QStringLiteral("\"token_vocabulary\" is not a vocabulary fingerprint (a whole number as a string)"));
      }
      imported.messages.push_back(message);
    }
    result.push_back(imported);
  }
  return result;
}

// A single chat's JSON export: its messages as it reads, each shown reply with its turn's other replies
// ("alternatives", put before it, as they were written before it); a marker's context start is the old id
// of a message in the file.
QList<ImportedConversation> parse_single_chat(const QJsonObject& root) {
  const Fields chat(root, QStringLiteral("the chat"));
  ImportedConversation imported;
  imported.conversation = conversation_record(chat);
  const QString place = conversation_place(0, imported.conversation.title);
  const QJsonArray items = Fields(root, place).array("messages");
  QHash<qint64, qint64> position_of_old_id;
  const auto add = [&](const QJsonValue& value, const QString& where) {
    if (!value.isObject()) fail(QStringLiteral("%1 is %2, not an object").arg(where, kind_of(value)));
    const Fields fields(value.toObject(), where);
    MessageRecord message = common_message(fields);
    message.id = imported.messages.size() + 1;
    const qint64 old_id = fields.integer("id", 0, std::numeric_limits<qint64>::max() / 2, 0);
    if (old_id != 0) position_of_old_id.insert(old_id, message.id);
    message.settings.remove(QLatin1String(kHiddenBranchKey));
    imported.messages.push_back(message);
  };
  for (qsizetype m = 0; m < items.size(); ++m) {
    const QString where = QStringLiteral("%1, message %2").arg(place).arg(m + 1);
    if (!items[m].isObject()) fail(QStringLiteral("%1 is %2, not an object").arg(where, kind_of(items[m])));
    const QJsonObject item = items[m].toObject();
    if (item.contains(QLatin1String("alternatives"))) {
      const QJsonArray alternatives = Fields(item, where).array("alternatives");
      for (qsizetype a = 0; a < alternatives.size(); ++a)
        add(alternatives[a], QStringLiteral("%1, alternative %2").arg(where).arg(a + 1));
    }
    add(item, where);
  }
  for (MessageRecord& message : imported.messages) {
    if (message.role != MessageRole::Marker || !message.settings.contains(QLatin1String(kMarkerContextStartKey)))
      continue;
    const qint64 start = message.settings.value(QLatin1String(kMarkerContextStartKey)).toInteger();
    // A start the file does not hold: the marker stays as a note, without a cut.
    if (position_of_old_id.contains(start))
      message.settings.insert(QLatin1String(kMarkerContextStartKey), position_of_old_id.value(start));
    else
      message.settings.remove(QLatin1String(kMarkerContextStartKey));
  }
  return {imported};
}

}  // namespace chat_archive_format

using namespace chat_archive_format;

QList<ImportedConversation> all_conversations(const ConversationStore& store) {
  QList<ImportedConversation> conversations;
  for (ConversationRecord record : store.conversations()) {
    record.generation_settings = store.generation_settings(record.id);
    record.reply_format = store.reply_format(record.id);
    conversations.push_back({record, store.messages(record.id)});
  }
  return conversations;
}

QString export_chat_archive(const QList<ImportedConversation>& conversations) {
  QJsonArray chats;
  for (const ImportedConversation& chat : conversations) {
    QJsonObject object;
    object.insert(QStringLiteral("title"), chat.conversation.title);
    object.insert(QStringLiteral("system_prompt"), chat.conversation.system_prompt);
    object.insert(QStringLiteral("created_at"), timestamp(chat.conversation.created_at));
    object.insert(QStringLiteral("updated_at"), timestamp(chat.conversation.updated_at));
    object.insert(QStringLiteral("pinned"), chat.conversation.pinned);
    object.insert(QStringLiteral("generation_settings"), chat.conversation.generation_settings);
    if (!chat.conversation.reply_format.isEmpty())
      object.insert(QStringLiteral("reply_format"), chat.conversation.reply_format);
    QHash<qint64, qint64> position_of;
    for (qsizetype i = 0; i < chat.messages.size(); ++i) position_of.insert(chat.messages[i].id, i + 1);
    QJsonArray messages;
    for (const MessageRecord& message : chat.messages) {
      QJsonObject item;
      item.insert(QStringLiteral("role"), role_name(message.role));
      item.insert(QStringLiteral("text"), message.text);
      item.insert(QStringLiteral("created_at"), timestamp(message.created_at));
      item.insert(QStringLiteral("model"), message.model);
      item.insert(QStringLiteral("backend"), message.backend);
      QJsonObject settings = message.settings;
      if (message.role == MessageRole::Marker && settings.contains(QLatin1String(kMarkerContextStartKey))) {
        // A start whose message was deleted: the first later one, as the model saw it from there on.
        const qint64 start = settings.value(QLatin1String(kMarkerContextStartKey)).toInteger();
        qint64 position = 0;
        for (qsizetype i = 0; i < chat.messages.size() && position == 0; ++i)
          if (chat.messages[i].id >= start) position = i + 1;
        if (position != 0) item.insert(QStringLiteral("context_starts_at"), position);
      }
      settings.remove(QLatin1String(kMarkerContextStartKey));
      item.insert(QStringLiteral("settings"), settings);
      item.insert(QStringLiteral("stats"), message.stats);
      item.insert(QStringLiteral("complete"), message.complete);
      item.insert(QStringLiteral("branch"), position_of.value(message.branch, 0));
      item.insert(QStringLiteral("forked_from"), position_of.value(message.forked_from, 0));
      insert_tool_use(item, message);
      if (!message.token_ids.empty()) {
        QJsonArray ids;
        for (const TokenId id : message.token_ids) ids.append(static_cast<qint64>(id));
        item.insert(QStringLiteral("token_ids"), ids);
        // A string: a 64-bit fingerprint does not survive JSON's numbers (doubles).
        item.insert(QStringLiteral("token_vocabulary"), QString::number(message.token_vocabulary));
      }
      messages.append(item);
    }
    object.insert(QStringLiteral("messages"), messages);
    chats.append(object);
  }
  QJsonObject root;
  root.insert(QStringLiteral("format"), QLatin1String(kChatArchiveFormat));
  root.insert(QStringLiteral("version"), kChatArchiveVersion);
  root.insert(QStringLiteral("conversations"), chats);
  return QString::fromUtf8(QJsonDocument(root).toJson(QJsonDocument::Indented));
}

QList<ImportedConversation> parse_chat_archive(const QByteArray& bytes) {
  if (bytes.size() > kMaxImportBytes)
    fail(QStringLiteral("it is %1 bytes; an import reads at most %2").arg(bytes.size()).arg(kMaxImportBytes));
  QJsonParseError error{};
  const QJsonDocument document = QJsonDocument::fromJson(bytes, &error);
  if (error.error != QJsonParseError::NoError)
    fail(QStringLiteral("it is not valid JSON (%1 at byte %2 of %3; is the file cut short?)")
             .arg(error.errorString())
             .arg(error.offset)
             .arg(bytes.size()));
  if (!document.isObject())
    fail(QStringLiteral("it is not a kvchat export: the JSON is %1, not an object")
             .arg(document.isArray() ? QStringLiteral("an array") : QStringLiteral("empty")));
  const QJsonObject root = document.object();
  if (root.contains(QLatin1String("format"))) {
    if (root.value(QLatin1String("format")).toString() != QLatin1String(kChatArchiveFormat))
      fail(QStringLiteral("it is not a kvchat export: its \"format\" is %1, not \"%2\"")
               .arg(root.value(QLatin1String("format")).isString()
                        ? quoted(root.value(QLatin1String("format")).toString().left(40))
                        : kind_of(root.value(QLatin1String("format"))))
               .arg(QLatin1String(kChatArchiveFormat)));
    return parse_archive(root);
  }
  if (root.contains(QLatin1String("messages")) && root.contains(QLatin1String("title"))) return parse_single_chat(root);
  fail(QStringLiteral("it is not a kvchat export: expected \"format\": \"%1\" (Export all chats) or a chat's JSON "
                      "export (\"title\" and \"messages\")")
           .arg(QLatin1String(kChatArchiveFormat)));
}

QList<ImportedConversation> read_chat_archive(const QString& path) {
  const auto fail_file = [&](const QString& why) { fail(QStringLiteral("cannot import %1: %2").arg(path, why)); };
  QFile file(path);
  if (QFileInfo(path).isDir()) fail_file(QStringLiteral("it is a folder"));
  if (!file.open(QIODevice::ReadOnly)) fail_file(file.errorString());
  // Checked before reading: a huge file is refused without being read.
  if (file.size() > kMaxImportBytes)
    fail_file(QStringLiteral("it is %1 bytes; an import reads at most %2").arg(file.size()).arg(kMaxImportBytes));
  const QByteArray bytes = file.read(kMaxImportBytes + 1);
  if (file.error() != QFileDevice::NoError) fail_file(file.errorString());
  try {
    return parse_chat_archive(bytes);
  } catch (const ArchiveError& error) {
    fail_file(QString::fromStdString(error.what()));
  }
  return {};
}

}  // namespace kvchat::app
