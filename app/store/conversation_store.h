#pragma once
// Conversations and their messages in SQLite (through Qt Sql). The promise: a crash loses at most the
// last second of one streaming reply, never a chat. Every write is its own committed transaction, the
// journal is WAL, and replies left unfinished by a crash are kept with their partial text.
#include <QDateTime>
#include <QJsonArray>
#include <QJsonObject>
#include <QList>
#include <QPair>
#include <QString>

#include <optional>

class QSqlDatabase;
#include <stdexcept>
#include <vector>

#include "app/store/message_role.h"
#include "engine/types.h"

namespace kvchat::app {

// Anything the database refused: the message names the database file and SQLite's own words.
struct StoreError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ConversationRecord {
  qint64 id = 0;
  QString title;
  QString system_prompt;
  QDateTime created_at;
  QDateTime updated_at;
  int message_count = 0;  // filled by conversations() and conversation()
  bool pinned = false;    // listed before the chats that are not
  // The chat's own generation settings (see generation_settings()); filled by conversation() only.
  QJsonObject generation_settings;
  // The chat's reply format (see reply_format()); filled by conversation() only.
  QJsonObject reply_format;
};

struct MessageRecord {
  qint64 id = 0;
  qint64 conversation_id = 0;
  MessageRole role = MessageRole::User;  // a marker: e.g. where old turns were dropped at the context limit
  QString text;
  QDateTime created_at;
  QString model;    // the model that answered (an assistant reply)
  QString backend;  // where it ran: "local", or the server's base URL; "" for replies older than the column
  QJsonObject settings;
  QJsonObject stats;
  bool complete = true;  // false while a reply is still streaming (or was killed mid-stream)
  // A reply's exact token ids, under the tokenizer whose vocabulary fingerprint is token_vocabulary: the next
  // prompt uses them in place of the text's encoding, so a turn after a restart or a lost cache is given the
  // same ids. Empty for typed messages, remote replies, and replies written before the column or whose text
  // changed since.
  std::vector<kvchat::TokenId> token_ids;
  quint64 token_vocabulary = 0;
  // Branches (see chat_history.h): the id of the user message that starts this message's branch (0: the
  // conversation's first branch), and on a user message that is an edit, the id of the message it replaces in
  // the shown path (the group's original). add_message() sets branch itself; forked_from only fork_message().
  qint64 branch = 0;
  qint64 forked_from = 0;
  // Tool use, in OpenAI's shapes. An assistant message's calls: [{"id", "type": "function", "function":
  // {"name", "arguments"}}] with the arguments as JSON text (empty: it called none). A tool message (role Tool):
  // the id of the call it answers and the tool's name.
  QJsonArray tool_calls;
  QString tool_call_id;
  QString tool_name;
};

// A conversation for import_conversations(): its record (title, system prompt, times, pinned; id and
// message_count unused) and its messages in order. A message's id, branch and forked_from, and a marker's
// context start (kMarkerContextStartKey), are numbers of this list's own (increasing along it), each mapped to
// the message's new id.
struct ImportedConversation {
  ConversationRecord conversation;
  QList<MessageRecord> messages;
};

// A conversation that search() found: the first of its messages that matched (0 when only its title did).
struct SearchHit {
  qint64 conversation_id = 0;
  qint64 first_message_id = 0;
};

// How the constructor treats a missing database file.
enum class StoreOpenMode {
  CreateIfMissing,  // the app: create the file, its folders and the schema
  ReadOnly,         // readers (the CLI's list and export): opened read-only, nothing is ever written; a
                    // missing file or one that is not kvchat's is a StoreError
};

class ConversationStore {
 public:
  // Opens or creates the database (WAL journal, synchronous=NORMAL, foreign keys, schema version table),
  // creating parent folders. A database is kvchat's when it carries kvchat's PRAGMA application_id (or,
  // written before that existed, exactly kvchat's tables); any other non-empty SQLite file is refused
  // before anything is written to it. Writes wait for other connections (busy timeout and retries). Each instance uses
  // its own QSqlDatabase connection name; use it from one thread only. Throws StoreError with the path and the SQLite
  // message (unwritable folder, corrupt file, not a database, full disk).
  explicit ConversationStore(const QString& database_path, StoreOpenMode open_mode = StoreOpenMode::CreateIfMissing);
  ~ConversationStore();
  ConversationStore(const ConversationStore&) = delete;
  ConversationStore& operator=(const ConversationStore&) = delete;

  static QString default_database_path();  // <QStandardPaths::AppDataLocation>/kvchat.sqlite3
  QString path() const;

  qint64 create_conversation(const QString& title, const QString& system_prompt = QString());
  void rename_conversation(qint64 conversation_id, const QString& title);
  void set_system_prompt(qint64 conversation_id, const QString& system_prompt);
  void delete_conversation(qint64 conversation_id);      // and its messages
  void set_pinned(qint64 conversation_id, bool pinned);  // committed; does not count as an update
  // The chat's own generation settings (GenerationPreset's JSON); {} = it follows the global settings (also for
  // an older file read as it is, and, logged, for a value that is not a JSON object). Setting {} clears them;
  // committed; not an update of the chat.
  QJsonObject generation_settings(qint64 conversation_id) const;
  void set_generation_settings(qint64 conversation_id, const QJsonObject& settings);
  // The chat's reply format (ReplyFormat's JSON, app/chat/reply_format.h); {} = free text (also for an older file
  // read as it is, and, logged, for a value that is not a JSON object). Committed; not an update of the chat.
  QJsonObject reply_format(qint64 conversation_id) const;
  void set_reply_format(qint64 conversation_id, const QJsonObject& format);
  QList<ConversationRecord> conversations() const;  // pinned first, then most recently updated first
  std::optional<ConversationRecord> conversation(qint64 conversation_id) const;

  QList<MessageRecord> messages(qint64 conversation_id) const;  // in order of creation
  // How many message lists messages() has read in this process, every store together: what the app's actions
  // cost in reads of a whole chat (a send reads at most one).
  static qint64 message_list_reads();
  std::optional<MessageRecord> message(qint64 message_id) const;
  // Committed before it returns; bumps updated_at. The message joins the shown path's branch (its own
  // branch and forked_from are not used).
  qint64 add_message(const MessageRecord& message);
  // Editing user message `message_id`: a new user message with `text` that starts a new branch, shown from now
  // on in place of that message and the rest of its group (which stay, hidden), in one transaction. Returns
  // its id.
  qint64 fork_message(qint64 conversation_id, qint64 message_id, const QString& text);
  // Shows branch `message_id` (a user message of a group) and hides the others of its group, in one transaction.
  void show_branch(qint64 conversation_id, qint64 message_id);
  // Deletes user message `message_id` of a group with its branch_subtree(), in one transaction. When it was the
  // group's original, its oldest remaining edit takes its place (its branch joins the original's, and the other
  // edits refer to it); when it was shown, the newest remaining member is shown.
  void delete_branch(qint64 conversation_id, qint64 message_id);
  // Streaming progress, committed (complete stays false); the message's token ids no longer match its text
  // and are cleared.
  void update_message_text(qint64 message_id, const QString& text);
  // complete = true, committed, with the text's exact token ids (none: cleared).
  void finish_message(qint64 message_id, const QString& text, const QJsonObject& stats,
                      const std::vector<kvchat::TokenId>& token_ids = {}, quint64 token_vocabulary = 0);
  void delete_messages_from(qint64 conversation_id, qint64 first_message_id);  // that message and all after it
  // Deletes exactly these messages, in one transaction: every id must be a message of the conversation, else
  // a StoreError and nothing is deleted.
  void delete_messages(qint64 conversation_id, const QList<qint64>& message_ids);
  // A new conversation holding a copy of this one: its title followed by " (copy)", its system prompt, and
  // every message with all its columns (text, times, model, settings, stats, token ids). A context-cut marker
  // points at the copy of the message it pointed at. Not pinned. Returns the copy's id.
  qint64 duplicate_conversation(qint64 conversation_id);
  // Adds the conversations as new ones (never over an existing one), with their messages and every field of
  // them, in one transaction: any error (an unknown role, a reference to a message the list does not hold, a
  // full disk) adds nothing. They are listed in the given order, after the pinned ones as usual, before the
  // chats already there. Returns their new ids, in order.
  QList<qint64> import_conversations(const QList<ImportedConversation>& conversations);
  // Records which backend and model answered a reply (a remote turn learns the model from the server).
  void set_message_origin(qint64 message_id, const QString& backend, const QString& model);
  // Replaces a message's settings object (e.g. which of a reply's alternatives is shown), committed.
  void set_message_settings(qint64 message_id, const QJsonObject& settings);

  // The conversations with a message (or a title) holding every word of `query`: each word matches a word of
  // the text or the start of one, case and accents aside. Whatever is typed is text, never query syntax
  // (quotes, AND, OR, NOT, *, -, parentheses); a word of punctuation alone matches where it appears as it is.
  // In the order of conversations(). An empty query finds nothing.
  QList<SearchHit> search(const QString& query) const;
  // Whether search() uses the full-text index (else it compares the text itself, slower on a large file).
  bool has_search_index() const { return has_search_index_; }

  // Runs SQLite's `PRAGMA integrity_check` and returns its first row ("ok" for a healthy file).
  QString integrity_check() const;

  // Every open runs PRAGMA quick_check. A damaged file is refused by a writer (StoreError naming the path and
  // the damage, nothing written); a reader opens it, so that what is intact can still be read and saved, and
  // damage() says what the check found ("" for a sound file).
  QString damage() const;
  // For a damaged file: which of the conversation's messages messages() cannot return ("" when none is
  // known to be missing, and always for a sound file).
  QString missing_messages(qint64 conversation_id) const;

  // 2: messages.backend. 3: messages.token_ids and token_vocabulary. 4: conversations.pinned. 5: messages_fts,
  // the full-text index of the messages. 6: messages.branch and forked_from. 7: conversations.generation_settings.
  // 8: the "tool" role, messages.tool_use (a message's tool calls, or the call a tool result answers) and
  // conversations.reply_format. Opening an older file for writing migrates it; a reader leaves it as it is.
  static constexpr int kSchemaVersion = 8;

 private:
  void update_message_columns(qint64 message_id, const QString& purpose, const QList<QPair<QString, QString>>& values);
  QJsonObject conversation_object(qint64 conversation_id, const QString& column, const QString& what) const;
  void set_conversation_object(qint64 conversation_id, const QString& column, const QString& what,
                               const QJsonObject& value);
  void check_for_damage(const QSqlDatabase& db, bool read_only);
  QString database_path_;
  QString damage_;
  QString connection_name_;
  bool has_backend_column_ = true;
  bool has_token_columns_ = true;
  bool has_pinned_column_ = true;
  bool has_branch_columns_ = true;
  bool has_generation_settings_column_ = true;
  bool has_tool_use_column_ = true;
  bool has_search_index_ = false;
};

}  // namespace kvchat::app
