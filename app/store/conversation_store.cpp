#include "app/store/conversation_store.h"
#include "app/store/chat_history.h"
#include "app/store/store_sql.h"
#include "app/store/tool_use.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <iterator>

#include <QDir>
#include <QFileInfo>
#include <QHash>
#include <QJsonDocument>
#include <QRegularExpression>
#include <QSqlDatabase>
#include <QSqlError>
#include <QSqlQuery>
#include <QStandardPaths>
#include <QStringList>
#include <QVariant>

namespace kvchat::app {

using namespace store_sql;

namespace {

// Timestamps are stored as milliseconds since the epoch (UTC): exact, sortable and zone-free.
qint64 now_ms() { return QDateTime::currentMSecsSinceEpoch(); }
QDateTime from_ms(qint64 ms) { return QDateTime::fromMSecsSinceEpoch(ms, Qt::UTC); }

// SQLite's NOT NULL columns must not receive a null QString (Qt binds it as SQL NULL).
QString non_null(const QString& text) { return text.isNull() ? QStringLiteral("") : text; }

QString json_text(const QJsonObject& object) {
  return QString::fromUtf8(QJsonDocument(object).toJson(QJsonDocument::Compact));
}

std::atomic<quint64> next_connection_number{0};

// AUTOINCREMENT: ids are never reused, so "this message and all after it" is simply id >= first.
const char* const kMessagesTable =
    "CREATE TABLE IF NOT EXISTS messages ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
    " role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool', 'marker')),"
    " text TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " model TEXT NOT NULL DEFAULT '',"
    " backend TEXT NOT NULL DEFAULT '',"
    " settings TEXT NOT NULL DEFAULT '{}',"
    " stats TEXT NOT NULL DEFAULT '{}',"
    " complete INTEGER NOT NULL DEFAULT 1,"
    // A reply's exact token ids (little-endian int32), and the vocabulary fingerprint they belong to.
    " token_ids BLOB,"
    " token_vocabulary INTEGER NOT NULL DEFAULT 0,"
    // Branches (chat_history.h): the id of the user message that starts the message's branch (0: the chat's
    // first), and on an edited user message the id of the original it is an edit of. Plain ids rather than
    // parent links: the shown path is the messages in id order less the hidden branches, so everything that
    // reads a chat in order keeps working on it.
    " branch INTEGER NOT NULL DEFAULT 0,"
    " forked_from INTEGER NOT NULL DEFAULT 0,"
    // Tool use (MessageRecord): {"tool_calls": [...]} on an assistant message that called tools, {"tool_call_id",
    // "name"} on a tool result; '' for any other message.
    " tool_use TEXT NOT NULL DEFAULT '')";

const char* const kMessagesIndex =
    "CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id)";

const char* const kSchema[] = {
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    // activity grows with every write to a conversation: it orders the list exactly even when two writes share
    // a millisecond or the wall clock steps back.
    "CREATE TABLE IF NOT EXISTS conversations ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " title TEXT NOT NULL,"
    " system_prompt TEXT NOT NULL DEFAULT '',"
    " created_at INTEGER NOT NULL,"
    " updated_at INTEGER NOT NULL,"
    " activity INTEGER NOT NULL DEFAULT 0,"
    " pinned INTEGER NOT NULL DEFAULT 0,"
    // The chat's own generation settings (JSON); '' = it follows the global settings.
    " generation_settings TEXT NOT NULL DEFAULT '',"
    // The chat's reply format (JSON, app/chat/reply_format.h); '' = free text.
    " reply_format TEXT NOT NULL DEFAULT '')",
    kMessagesTable,
    kMessagesIndex,
};

// The messages' full-text index (FTS5, an external-content table: the text is stored once, in messages),
// kept in step with every insert, edit and delete by triggers. Words are Unicode words, case and accents
// folded (unicode61). Debian's SQLite has FTS5; a build without it gets no index (the CREATE fails with "no
// such module") and search() falls back to comparing the text itself.
const char* const kSearchIndexSchema[] = {
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(text, content='messages', content_rowid='id',"
    " tokenize='unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN"
    " INSERT INTO messages_fts (rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN"
    " INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE OF text ON messages BEGIN"
    " INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.id, old.text);"
    " INSERT INTO messages_fts (rowid, text) VALUES (new.id, new.text); END",
};

// Creates the index (inside the caller's transaction), filled from the messages already there. False when
// this SQLite has no FTS5.
bool create_search_index(const QSqlDatabase& db, const QString& path) {
  QSqlQuery probe(db);
  if (!probe.exec(QString::fromLatin1(kSearchIndexSchema[0]))) {
    spdlog::warn("conversation store {}: no full-text index ({}); search compares the text instead", path.toStdString(),
                 store_sql::sqlite_message(probe.lastError()).toStdString());
    return false;
  }
  for (std::size_t i = 1; i < std::size(kSearchIndexSchema); ++i)
    store_sql::StoreQuery(db, path, QStringLiteral("cannot create the search index"),
                          QString::fromLatin1(kSearchIndexSchema[i]))
        .run();
  store_sql::StoreQuery(db, path, QStringLiteral("cannot fill the search index"),
                        QStringLiteral("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')"))
      .run();
  return true;
}

// Version 7 -> 8 for the messages table: its role CHECK admits "tool", and it gains the tool_use column.
// SQLite cannot change a CHECK in place, so the table is rebuilt by SQLite's own procedure (a new table, the
// rows copied, the old one dropped, the new one renamed), inside the migration's transaction; then its index,
// its AUTOINCREMENT counter (ids are never reused, a deleted last message's included) and the search index's
// triggers and contents are set up again.
void rebuild_messages_table(const QSqlDatabase& db, const QString& path) {
  const QString purpose = QStringLiteral("cannot migrate the schema to version 8");
  const auto run = [&](const QString& statement) { store_sql::StoreQuery(db, path, purpose, statement).run(); };
  const QVariant counter =
      store_sql::StoreQuery(db, path, purpose,
                            QStringLiteral("SELECT seq FROM sqlite_sequence WHERE name = 'messages'"))
          .single_value();
  const bool had_search_index =
      store_sql::StoreQuery(
          db, path, purpose,
          QStringLiteral("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages_fts'"))
          .single_value()
          .isValid();
  const QString columns = QStringLiteral(
      "id, conversation_id, role, text, created_at, model, backend, settings, stats, complete, token_ids,"
      " token_vocabulary, branch, forked_from");
  run(QString::fromLatin1(kMessagesTable)
          .replace(QStringLiteral("IF NOT EXISTS messages ("), QStringLiteral("messages_rebuilt (")));
  run(QStringLiteral("INSERT INTO messages_rebuilt (%1) SELECT %1 FROM messages").arg(columns));
  run(QStringLiteral("DROP TABLE messages"));  // with its index and the search index's triggers
  run(QStringLiteral("ALTER TABLE messages_rebuilt RENAME TO messages"));
  run(QString::fromLatin1(kMessagesIndex));
  if (counter.isValid())
    run(QStringLiteral("UPDATE sqlite_sequence SET seq = max(seq, %1) WHERE name = 'messages'")
            .arg(counter.toLongLong()));
  if (had_search_index) create_search_index(db, path);
}

// The schema's CHECK admits only the five roles; a file edited around it still opens: the message shows as a
// note (a marker), never goes to the model under a role it does not have.
MessageRole role_column(const QString& path, qint64 message_id, const QString& text) {
  if (const std::optional<MessageRole> role = parse_message_role(text)) return *role;
  spdlog::warn("conversation store {}: message {} has the unknown role '{}'; shown as a note", path.toStdString(),
               message_id, text.left(40).toStdString());
  return MessageRole::Marker;
}

QJsonObject parse_json_column(const QString& path, qint64 message_id, const char* column, const QString& text) {
  if (text.isEmpty()) return {};
  QJsonParseError error{};
  QJsonDocument document = QJsonDocument::fromJson(text.toUtf8(), &error);
  if (error.error != QJsonParseError::NoError || !document.isObject()) {
    // One damaged column must not make the whole chat unreadable: keep the message, drop the column.
    spdlog::warn("conversation store {}: message {} has an unreadable {} column ({}); using an empty object",
                 path.toStdString(), message_id, column, error.errorString().toStdString());
    return {};
  }
  return document.object();
}

}  // namespace

namespace {

// PRAGMA application_id of kvchat's databases ("kvCh"): SQLite's way for a file to say whose it is.
constexpr qint32 kApplicationId = 0x6B764368;

// Whose database a file is, found by reading only (a foreign file must be left exactly as it was).
enum class DatabaseOwner {
  Empty,            // a new or zero-length file: no tables
  Kvchat,           // carries kvchat's application_id
  KvchatWithoutId,  // kvchat's three tables, written before the application_id was set
  Foreign,          // anything else
};

struct DatabaseIdentity {
  DatabaseOwner owner = DatabaseOwner::Empty;
  QString description;  // for the error: the application_id and the first tables
};

DatabaseIdentity identify_database(const QSqlDatabase& db, const QString& path) {
  // The first statement reads the file header: garbage fails here ("file is not a database").
  const qint32 application_id =
      StoreQuery(db, path, QStringLiteral("cannot read the file header"), QStringLiteral("PRAGMA application_id"))
          .single_value()
          .toInt();
  StoreQuery tables_query(db, path, QStringLiteral("cannot read the schema"),
                          QStringLiteral("SELECT name FROM sqlite_master WHERE type = 'table'"
                                         " AND name NOT LIKE 'sqlite_%' ORDER BY name"));
  QSqlQuery& rows = tables_query.run();
  QStringList tables;
  while (rows.next()) tables << rows.value(0).toString();
  rows.finish();

  DatabaseIdentity identity;
  identity.description =
      QStringLiteral("application_id %1, tables: %2")
          .arg(application_id)
          .arg(tables.isEmpty() ? QStringLiteral("none") : tables.mid(0, 8).join(QStringLiteral(", ")));
  const QStringList kvchat_tables = {QStringLiteral("conversations"), QStringLiteral("messages"),
                                     QStringLiteral("schema_version")};
  // The same with the search index's own tables (a file of this version whose id was cleared).
  const QStringList kvchat_tables_with_search_index = {
      QStringLiteral("conversations"),     QStringLiteral("messages"),
      QStringLiteral("messages_fts"),      QStringLiteral("messages_fts_config"),
      QStringLiteral("messages_fts_data"), QStringLiteral("messages_fts_docsize"),
      QStringLiteral("messages_fts_idx"),  QStringLiteral("schema_version")};
  if (application_id == kApplicationId)
    identity.owner = DatabaseOwner::Kvchat;
  else if (application_id == 0 && tables.isEmpty())
    identity.owner = DatabaseOwner::Empty;
  else if (application_id == 0 && (tables == kvchat_tables || tables == kvchat_tables_with_search_index))
    identity.owner = DatabaseOwner::KvchatWithoutId;
  else
    identity.owner = DatabaseOwner::Foreign;
  return identity;
}

void create_schema(const QSqlDatabase& db, const QString& path) {
  WriteTransaction transaction(db, path, QStringLiteral("cannot create the schema"));
  for (const char* statement : kSchema)
    StoreQuery(db, path, QStringLiteral("cannot create the schema"), QString::fromLatin1(statement)).run();
  create_search_index(db, path);
  StoreQuery(db, path, QStringLiteral("cannot record the schema version"),
             QStringLiteral("INSERT INTO schema_version (version) VALUES (:version)"))
      .bind(QStringLiteral(":version"), ConversationStore::kSchemaVersion)
      .run();
  StoreQuery(db, path, QStringLiteral("cannot set the application id"),
             QStringLiteral("PRAGMA application_id = %1").arg(kApplicationId))
      .run();
  transaction.commit();
  spdlog::info("conversation store {}: created (schema version {})", path.toStdString(),
               ConversationStore::kSchemaVersion);
}

int check_schema_version(const QSqlDatabase& db, const QString& path) {
  StoreQuery version_query(db, path, QStringLiteral("cannot read the schema version"),
                           QStringLiteral("SELECT max(version) FROM schema_version"));
  const int version = version_query.single_value().toInt();
  if (version > ConversationStore::kSchemaVersion)
    fail(path, QStringLiteral("schema version %1 is newer than this program's %2")
                   .arg(version)
                   .arg(ConversationStore::kSchemaVersion));
  if (version < 1) fail(path, QStringLiteral("schema_version table holds no valid version"));
  return version;
}

// Version 1 -> 2: messages.backend, which backend answered a reply ('' for replies written before).
// Version 2 -> 3: messages.token_ids and token_vocabulary, a reply's exact ids (none for replies written
// before: their text is encoded, the same way every time).
// Version 3 -> 4: conversations.pinned (no chat was pinned before).
// Version 4 -> 5: messages_fts, the full-text index, filled from the messages there.
// Version 5 -> 6: messages.branch and forked_from (every message before was on the chat's one branch, 0).
// Version 6 -> 7: conversations.generation_settings (every chat followed the global settings before).
// Version 7 -> 8: the "tool" role and messages.tool_use (rebuild_messages_table; no message used tools before),
// and conversations.reply_format (every chat's replies were free text before).
void migrate_schema(const QSqlDatabase& db, const QString& path, int version) {
  if (version >= ConversationStore::kSchemaVersion) return;
  WriteTransaction transaction(db, path, QStringLiteral("cannot migrate the schema"));
  const QStringList steps[] = {
      {QStringLiteral("ALTER TABLE messages ADD COLUMN backend TEXT NOT NULL DEFAULT ''")},
      {QStringLiteral("ALTER TABLE messages ADD COLUMN token_ids BLOB"),
       QStringLiteral("ALTER TABLE messages ADD COLUMN token_vocabulary INTEGER NOT NULL DEFAULT 0")},
      {QStringLiteral("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")},
      {},  // create_search_index
      {QStringLiteral("ALTER TABLE messages ADD COLUMN branch INTEGER NOT NULL DEFAULT 0"),
       QStringLiteral("ALTER TABLE messages ADD COLUMN forked_from INTEGER NOT NULL DEFAULT 0")},
      {QStringLiteral("ALTER TABLE conversations ADD COLUMN generation_settings TEXT NOT NULL DEFAULT ''")},
      // and rebuild_messages_table
      {QStringLiteral("ALTER TABLE conversations ADD COLUMN reply_format TEXT NOT NULL DEFAULT ''")},
  };
  for (int to = version + 1; to <= ConversationStore::kSchemaVersion; ++to) {
    if (to == 5) create_search_index(db, path);
    if (to == 8) rebuild_messages_table(db, path);
    for (const QString& statement : steps[to - 2])
      StoreQuery(db, path, QStringLiteral("cannot migrate the schema to version %1").arg(to), statement).run();
    StoreQuery(db, path, QStringLiteral("cannot record the schema version"),
               QStringLiteral("INSERT INTO schema_version (version) VALUES (%1)").arg(to))
        .run();
  }
  transaction.commit();
  spdlog::info("conversation store {}: migrated from schema version {} to {}", path.toStdString(), version,
               ConversationStore::kSchemaVersion);
}

// PRAGMA quick_check or integrity_check (with a limit on the findings): "" for a sound file, else what it
// found, or the error that stopped it (a damaged page can make the check itself fail).
QString check_database(const QSqlDatabase& db, const QString& pragma) {
  QSqlQuery query(db);
  if (!query.exec(pragma)) return sqlite_message(query.lastError());
  QStringList findings;
  while (query.next()) findings << query.value(0).toString().split(QLatin1Char('\n'), Qt::SkipEmptyParts);
  query.finish();
  if (findings == QStringList{QStringLiteral("ok")}) return {};
  findings.removeAll(QStringLiteral("*** in database main ***"));
  return findings.isEmpty() ? QStringLiteral("the check gave no result") : findings.join(QStringLiteral("; "));
}

// The connection settings of a writer: WAL journal, NORMAL sync, foreign keys.
void configure_writer(const QSqlDatabase& db, const QString& path) {
  StoreQuery wal(db, path, QStringLiteral("cannot enable the WAL journal"),
                 QStringLiteral("PRAGMA journal_mode = WAL"));
  const QString journal_mode = wal.single_value().toString();
  if (journal_mode.compare(QLatin1String("wal"), Qt::CaseInsensitive) != 0)
    spdlog::warn("conversation store {}: journal mode is '{}', not WAL (file system without shared memory?)",
                 path.toStdString(), journal_mode.toStdString());
  // WAL + NORMAL: a commit survives a crash of the program; only a power loss may drop the latest commits.
  StoreQuery(db, path, QStringLiteral("cannot set synchronous"), QStringLiteral("PRAGMA synchronous = NORMAL")).run();
  StoreQuery(db, path, QStringLiteral("cannot enable foreign keys"), QStringLiteral("PRAGMA foreign_keys = ON")).run();
}

}  // namespace

ConversationStore::ConversationStore(const QString& database_path, StoreOpenMode open_mode)
    : database_path_(QFileInfo(database_path).absoluteFilePath()) {
  if (database_path.isEmpty()) throw StoreError("conversation store: empty database path");
  const QFileInfo info(database_path_);
  const bool read_only = open_mode == StoreOpenMode::ReadOnly;
  if (read_only && !info.exists()) fail(database_path_, QStringLiteral("no such file"));
  if (info.exists() && info.isDir()) fail(database_path_, QStringLiteral("is a folder, not a database file"));
  if (!read_only && !QDir().mkpath(info.absolutePath()))
    fail(database_path_, QStringLiteral("cannot create the folder %1").arg(info.absolutePath()));

  connection_name_ = QStringLiteral("kvchat-store-%1").arg(next_connection_number.fetch_add(1));
  try {
    QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), connection_name_);
    if (!db.isValid()) fail(database_path_, QStringLiteral("the Qt SQLite driver (QSQLITE) is not available"));
    db.setDatabaseName(database_path_);
    if (read_only) db.setConnectOptions(QStringLiteral("QSQLITE_OPEN_READONLY"));
    if (!db.open()) fail(database_path_, QStringLiteral("cannot open"), db.lastError());
    // Before anything that may wait for a lock: another process may hold it for a moment.
    StoreQuery(db, database_path_, QStringLiteral("cannot set the busy timeout"),
               QStringLiteral("PRAGMA busy_timeout = %1").arg(kBusyTimeoutMs))
        .run();

    // Identified before the first write: another program's database is refused untouched.
    const DatabaseIdentity identity = identify_database(db, database_path_);
    if (identity.owner == DatabaseOwner::Foreign || (read_only && identity.owner == DatabaseOwner::Empty))
      fail(database_path_,
           QStringLiteral("not a kvchat database (%1); it was left unchanged").arg(identity.description));
    // Every check that may refuse the file comes before the first write (the journal mode is one): a refused
    // file is left exactly as it was.
    const int version = identity.owner == DatabaseOwner::Empty ? 0 : check_schema_version(db, database_path_);
    if (identity.owner != DatabaseOwner::Empty) check_for_damage(db, read_only);
    if (!read_only) configure_writer(db, database_path_);
    if (identity.owner == DatabaseOwner::Empty) {
      create_schema(db, database_path_);
    } else {
      // A reader leaves an older file as it is and reads it without the newer columns.
      if (!read_only) migrate_schema(db, database_path_, version);
      has_backend_column_ = !read_only || version >= 2;
      has_token_columns_ = !read_only || version >= 3;
      has_pinned_column_ = !read_only || version >= 4;
      has_branch_columns_ = !read_only || version >= 6;
      has_generation_settings_column_ = !read_only || version >= 7;
      has_tool_use_column_ = !read_only || version >= 8;
      if (identity.owner == DatabaseOwner::KvchatWithoutId && !read_only)
        StoreQuery(db, database_path_, QStringLiteral("cannot set the application id"),
                   QStringLiteral("PRAGMA application_id = %1").arg(kApplicationId))
            .run();
    }
    has_search_index_ = StoreQuery(db, database_path_, QStringLiteral("cannot read the schema"),
                                   QStringLiteral("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                                                  " AND name = 'messages_fts'"))
                            .single_value()
                            .isValid();
    spdlog::debug("conversation store {}: open{} (connection {})", database_path_.toStdString(),
                  read_only ? " read-only" : "", connection_name_.toStdString());
  } catch (...) {
    {
      QSqlDatabase db = QSqlDatabase::database(connection_name_, false);
      if (db.isValid()) db.close();
    }
    QSqlDatabase::removeDatabase(connection_name_);
    throw;
  }
}

ConversationStore::~ConversationStore() {
  {
    QSqlDatabase db = QSqlDatabase::database(connection_name_, false);
    if (db.isValid()) db.close();
  }
  // Only after every QSqlDatabase handle of this connection is gone.
  QSqlDatabase::removeDatabase(connection_name_);
}

QString ConversationStore::default_database_path() {
  QString directory = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
  if (directory.isEmpty()) directory = QDir::homePath() + QStringLiteral("/.local/share/kvchat");
  return QDir(directory).filePath(QStringLiteral("kvchat.sqlite3"));
}

QString ConversationStore::path() const { return database_path_; }

namespace {

QSqlDatabase connection(const QString& name) { return QSqlDatabase::database(name, false); }

// The next value of the conversations' activity counter (see the schema).
qint64 next_activity(const QSqlDatabase& db, const QString& path) {
  StoreQuery query(db, path, QStringLiteral("cannot read the activity counter"),
                   QStringLiteral("SELECT coalesce(max(activity), 0) + 1 FROM conversations"));
  return query.single_value().toLongLong();
}

void touch_conversation(const QSqlDatabase& db, const QString& path, qint64 conversation_id) {
  const qint64 activity = next_activity(db, path);
  StoreQuery(db, path, QStringLiteral("cannot update conversation %1").arg(conversation_id),
             QStringLiteral("UPDATE conversations SET updated_at = :now, activity = :activity WHERE id = :id"))
      .bind(QStringLiteral(":now"), now_ms())
      .bind(QStringLiteral(":activity"), activity)
      .bind(QStringLiteral(":id"), conversation_id)
      .run();
}

void require_rows_affected(QSqlQuery& query, const QString& path, const QString& what) {
  if (query.numRowsAffected() < 1) fail(path, what);
}

ConversationRecord conversation_from_row(const QSqlQuery& row) {
  ConversationRecord record;
  record.id = row.value(0).toLongLong();
  record.title = row.value(1).toString();
  record.system_prompt = row.value(2).toString();
  record.created_at = from_ms(row.value(3).toLongLong());
  record.updated_at = from_ms(row.value(4).toLongLong());
  record.message_count = row.value(5).toInt();
  record.pinned = row.value(6).toInt() != 0;
  return record;
}

// An older file opened read-only lacks the pinned column.
QString conversation_columns(bool has_pinned_column) {
  return QStringLiteral(
             "SELECT c.id, c.title, c.system_prompt, c.created_at, c.updated_at,"
             " (SELECT count(*) FROM messages m WHERE m.conversation_id = c.id), %1 FROM conversations c")
      .arg(has_pinned_column ? QStringLiteral("c.pinned") : QStringLiteral("0"));
}

// An older file opened read-only lacks the newer columns.
QString message_columns(bool has_backend_column, bool has_token_columns, bool has_branch_columns,
                        bool has_tool_use_column) {
  return QStringLiteral(
             "SELECT id, conversation_id, role, text, created_at, model, settings, stats, complete, %1, %2,"
             " %3, %4 FROM messages")
      .arg(has_backend_column ? QStringLiteral("backend") : QStringLiteral("''"),
           has_token_columns ? QStringLiteral("token_ids, token_vocabulary") : QStringLiteral("NULL, 0"),
           has_branch_columns ? QStringLiteral("branch, forked_from") : QStringLiteral("0, 0"),
           has_tool_use_column ? QStringLiteral("tool_use") : QStringLiteral("''"));
}

// The tool_use column of a message: '' when it neither called tools nor answers a call.
QString tool_use_text(const MessageRecord& message) {
  QJsonObject tool_use;
  insert_tool_use(tool_use, message);
  return tool_use.isEmpty() ? QString() : json_text(tool_use);
}

// A damaged column loses the message's tool use, not the message.
void tool_use_from_column(MessageRecord& record, const QString& path, const QString& text) {
  const QString problem = read_tool_use(parse_json_column(path, record.id, "tool_use", text), record);
  if (problem.isEmpty()) return;
  spdlog::warn("conversation store {}: message {} has an unreadable tool_use column ({}); shown without it",
               path.toStdString(), record.id, problem.toStdString());
  record.tool_calls = {};
  record.tool_call_id.clear();
  record.tool_name.clear();
}

QByteArray token_ids_blob(const std::vector<TokenId>& ids) {
  QByteArray blob;
  blob.reserve(static_cast<int>(ids.size() * 4));
  for (const TokenId id : ids) {
    const auto value = static_cast<std::uint32_t>(id);
    for (int shift = 0; shift < 32; shift += 8) blob.append(static_cast<char>((value >> shift) & 0xFF));
  }
  return blob;
}

// SQL NULL for no ids.
QVariant token_ids_column(const std::vector<TokenId>& ids) {
  return ids.empty() ? QVariant(QMetaType(QMetaType::QByteArray)) : QVariant(token_ids_blob(ids));
}

std::vector<TokenId> token_ids_from_blob(const QString& path, qint64 message_id, const QByteArray& blob) {
  std::vector<TokenId> ids;
  if (blob.size() % 4 != 0) {
    // The ids only save re-encoding the text: a damaged column is dropped, the message kept.
    spdlog::warn(
        "conversation store {}: message {} has an unreadable token_ids column ({} bytes); its text will be "
        "encoded instead",
        path.toStdString(), message_id, blob.size());
    return ids;
  }
  ids.reserve(static_cast<std::size_t>(blob.size() / 4));
  for (int at = 0; at < blob.size(); at += 4) {
    std::uint32_t value = 0;
    for (int byte = 0; byte < 4; ++byte)
      value |= static_cast<std::uint32_t>(static_cast<unsigned char>(blob[at + byte])) << (8 * byte);
    ids.push_back(static_cast<TokenId>(value));
  }
  return ids;
}

MessageRecord message_from_row(const QSqlQuery& row, const QString& path) {
  MessageRecord record;
  record.id = row.value(0).toLongLong();
  record.conversation_id = row.value(1).toLongLong();
  record.role = role_column(path, record.id, row.value(2).toString());
  record.text = row.value(3).toString();
  record.created_at = from_ms(row.value(4).toLongLong());
  record.model = row.value(5).toString();
  record.settings = parse_json_column(path, record.id, "settings", row.value(6).toString());
  record.stats = parse_json_column(path, record.id, "stats", row.value(7).toString());
  record.complete = row.value(8).toInt() != 0;
  record.backend = row.value(9).toString();
  record.token_ids = token_ids_from_blob(path, record.id, row.value(10).toByteArray());
  record.token_vocabulary = static_cast<quint64>(row.value(11).toLongLong());
  if (record.token_ids.empty()) record.token_vocabulary = 0;
  record.branch = row.value(12).toLongLong();
  record.forked_from = row.value(13).toLongLong();
  tool_use_from_column(record, path, row.value(14).toString());
  return record;
}

// What the branch rules need of a conversation's messages (no text, no token ids), inside a write transaction.
QList<MessageRecord> branch_records(const QSqlDatabase& db, const QString& path, const QString& purpose,
                                    qint64 conversation_id) {
  StoreQuery query(db, path, purpose,
                   QStringLiteral("SELECT id, role, settings, branch, forked_from FROM messages"
                                  " WHERE conversation_id = :id ORDER BY id"));
  query.bind(QStringLiteral(":id"), conversation_id);
  QSqlQuery& rows = query.run();
  QList<MessageRecord> records;
  while (rows.next()) {
    MessageRecord record;
    record.id = rows.value(0).toLongLong();
    record.conversation_id = conversation_id;
    record.role = role_column(path, record.id, rows.value(1).toString());
    record.settings = parse_json_column(path, record.id, "settings", rows.value(2).toString());
    record.branch = rows.value(3).toLongLong();
    record.forked_from = rows.value(4).toLongLong();
    records.append(record);
  }
  return records;
}

// The columns a message row is written with (an added message, an imported one): all but its id and branch.
StoreQuery& bind_message_columns(StoreQuery& query, const MessageRecord& message, qint64 conversation_id,
                                 qint64 created_ms) {
  return query.bind(QStringLiteral(":conversation_id"), conversation_id)
      .bind(QStringLiteral(":role"), role_name(message.role))
      .bind(QStringLiteral(":text"), non_null(message.text))
      .bind(QStringLiteral(":created_at"), created_ms)
      .bind(QStringLiteral(":model"), non_null(message.model))
      .bind(QStringLiteral(":backend"), non_null(message.backend))
      .bind(QStringLiteral(":settings"), json_text(message.settings))
      .bind(QStringLiteral(":stats"), json_text(message.stats))
      .bind(QStringLiteral(":complete"), message.complete ? 1 : 0)
      .bind(QStringLiteral(":token_ids"), token_ids_column(message.token_ids))
      .bind(QStringLiteral(":token_vocabulary"),
            message.token_ids.empty() ? 0 : static_cast<qint64>(message.token_vocabulary))
      .bind(QStringLiteral(":tool_use"), non_null(tool_use_text(message)));
}

// How a write to a branch group starts: a transaction, the chat's messages as the branch rules see them, and
// the group that `message_id` is a member of (a failure when it starts no branch).
struct BranchGroupWrite {
  BranchGroupWrite(const QSqlDatabase& database, const QString& path, const QString& purpose, qint64 conversation_id,
                   qint64 message_id)
      : db(database),
        transaction(db, path, purpose),
        records(branch_records(db, path, purpose, conversation_id)),
        group(branch_siblings(records, message_id)) {
    if (group.isEmpty()) fail(path, purpose + QStringLiteral(": message %1 starts no branch").arg(message_id));
  }
  QSqlDatabase db;
  WriteTransaction transaction;
  const QList<MessageRecord> records;
  const QList<qint64> group;
};

// Marks one member of a branch group hidden or shown (its settings key), when it is not already.
void set_branch_hidden(const QSqlDatabase& db, const QString& path, const QString& purpose, const MessageRecord& member,
                       bool hidden) {
  if (member.settings.value(QLatin1String(kHiddenBranchKey)).toBool() == hidden) return;
  QJsonObject settings = member.settings;
  if (hidden)
    settings.insert(QLatin1String(kHiddenBranchKey), true);
  else
    settings.remove(QLatin1String(kHiddenBranchKey));
  StoreQuery(db, path, purpose, QStringLiteral("UPDATE messages SET settings = :settings WHERE id = :id"))
      .bind(QStringLiteral(":settings"), json_text(settings))
      .bind(QStringLiteral(":id"), member.id)
      .run();
}

}  // namespace

qint64 ConversationStore::create_conversation(const QString& title, const QString& system_prompt) {
  QSqlDatabase db = connection(connection_name_);
  WriteTransaction transaction(db, database_path_, QStringLiteral("cannot create a conversation"));
  const qint64 now = now_ms();
  StoreQuery insert(db, database_path_, QStringLiteral("cannot create a conversation"),
                    QStringLiteral("INSERT INTO conversations (title, system_prompt, created_at, updated_at, activity)"
                                   " VALUES (:title, :system_prompt, :now, :now, :activity)"));
  insert.bind(QStringLiteral(":title"), non_null(title))
      .bind(QStringLiteral(":system_prompt"), non_null(system_prompt))
      .bind(QStringLiteral(":now"), now)
      .bind(QStringLiteral(":activity"), next_activity(db, database_path_));
  const qint64 id = insert.run().lastInsertId().toLongLong();
  transaction.commit();
  spdlog::debug("conversation store: created conversation {}", id);
  return id;
}

void ConversationStore::rename_conversation(qint64 conversation_id, const QString& title) {
  QSqlDatabase db = connection(connection_name_);
  WriteTransaction transaction(db, database_path_,
                               QStringLiteral("cannot rename conversation %1").arg(conversation_id));
  StoreQuery update(db, database_path_, QStringLiteral("cannot rename conversation %1").arg(conversation_id),
                    QStringLiteral("UPDATE conversations SET title = :title WHERE id = :id"));
  update.bind(QStringLiteral(":title"), non_null(title)).bind(QStringLiteral(":id"), conversation_id);
  require_rows_affected(update.run(), database_path_, QStringLiteral("no conversation %1").arg(conversation_id));
  touch_conversation(db, database_path_, conversation_id);
  transaction.commit();
}

void ConversationStore::set_system_prompt(qint64 conversation_id, const QString& system_prompt) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot set the system prompt of conversation %1").arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  StoreQuery update(db, database_path_, purpose,
                    QStringLiteral("UPDATE conversations SET system_prompt = :system_prompt WHERE id = :id"));
  update.bind(QStringLiteral(":system_prompt"), non_null(system_prompt)).bind(QStringLiteral(":id"), conversation_id);
  require_rows_affected(update.run(), database_path_, QStringLiteral("no conversation %1").arg(conversation_id));
  touch_conversation(db, database_path_, conversation_id);
  transaction.commit();
}

void ConversationStore::set_pinned(qint64 conversation_id, bool pinned) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot %1 conversation %2")
                              .arg(pinned ? QStringLiteral("pin") : QStringLiteral("unpin"))
                              .arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  // Not an activity: pinning leaves the chat's place among the other pinned (or unpinned) chats as it was.
  StoreQuery update(db, database_path_, purpose,
                    QStringLiteral("UPDATE conversations SET pinned = :pinned WHERE id = :id"));
  update.bind(QStringLiteral(":pinned"), pinned ? 1 : 0).bind(QStringLiteral(":id"), conversation_id);
  require_rows_affected(update.run(), database_path_, QStringLiteral("no conversation %1").arg(conversation_id));
  transaction.commit();
}

// A conversation's JSON object column (generation_settings, reply_format): '' is {}, and so (logged) is a damaged
// value, which must not lose the chat.
QJsonObject ConversationStore::conversation_object(qint64 conversation_id, const QString& column,
                                                   const QString& what) const {
  QSqlDatabase db = connection(connection_name_);
  StoreQuery query(db, database_path_,
                   QStringLiteral("cannot read the %1 of conversation %2").arg(what).arg(conversation_id),
                   QStringLiteral("SELECT %1 FROM conversations WHERE id = :id").arg(column));
  query.bind(QStringLiteral(":id"), conversation_id);
  const QString text = query.single_value().toString();
  if (text.isEmpty()) return {};
  QJsonParseError error;
  const QJsonDocument document = QJsonDocument::fromJson(text.toUtf8(), &error);
  if (error.error != QJsonParseError::NoError || !document.isObject()) {
    spdlog::warn("conversation store {}: conversation {} has an unreadable {} ({}); using none",
                 database_path_.toStdString(), conversation_id, what.toStdString(), error.errorString().toStdString());
    return {};
  }
  return document.object();
}

void ConversationStore::set_conversation_object(qint64 conversation_id, const QString& column, const QString& what,
                                                const QJsonObject& value) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot set the %1 of conversation %2").arg(what).arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  // Not an activity, like pinning: choosing a preset or a reply format does not move the chat up the list.
  StoreQuery update(db, database_path_, purpose,
                    QStringLiteral("UPDATE conversations SET %1 = :value WHERE id = :id").arg(column));
  update.bind(QStringLiteral(":value"), value.isEmpty() ? QStringLiteral("") : json_text(value))
      .bind(QStringLiteral(":id"), conversation_id);
  require_rows_affected(update.run(), database_path_, QStringLiteral("no conversation %1").arg(conversation_id));
  transaction.commit();
}

QJsonObject ConversationStore::generation_settings(qint64 conversation_id) const {
  if (!has_generation_settings_column_) return {};
  return conversation_object(conversation_id, QStringLiteral("generation_settings"),
                             QStringLiteral("generation settings"));
}

void ConversationStore::set_generation_settings(qint64 conversation_id, const QJsonObject& settings) {
  set_conversation_object(conversation_id, QStringLiteral("generation_settings"), QStringLiteral("generation settings"),
                          settings);
}

QJsonObject ConversationStore::reply_format(qint64 conversation_id) const {
  if (!has_tool_use_column_) return {};  // the same version added both
  return conversation_object(conversation_id, QStringLiteral("reply_format"), QStringLiteral("reply format"));
}

void ConversationStore::set_reply_format(qint64 conversation_id, const QJsonObject& format) {
  set_conversation_object(conversation_id, QStringLiteral("reply_format"), QStringLiteral("reply format"), format);
}

void ConversationStore::delete_conversation(qint64 conversation_id) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot delete conversation %1").arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  // Explicit rather than relying on ON DELETE CASCADE alone: a file written with foreign keys off stays clean.
  StoreQuery(db, database_path_, purpose, QStringLiteral("DELETE FROM messages WHERE conversation_id = :id"))
      .bind(QStringLiteral(":id"), conversation_id)
      .run();
  StoreQuery remove(db, database_path_, purpose, QStringLiteral("DELETE FROM conversations WHERE id = :id"));
  remove.bind(QStringLiteral(":id"), conversation_id);
  require_rows_affected(remove.run(), database_path_, QStringLiteral("no conversation %1").arg(conversation_id));
  transaction.commit();
  spdlog::debug("conversation store: deleted conversation {}", conversation_id);
}

QList<ConversationRecord> ConversationStore::conversations() const {
  QSqlDatabase db = connection(connection_name_);
  StoreQuery query(db, database_path_, QStringLiteral("cannot list conversations"),
                   conversation_columns(has_pinned_column_) +
                       QStringLiteral(" ORDER BY %1c.activity DESC, c.updated_at DESC, c.id DESC")
                           .arg(has_pinned_column_ ? QStringLiteral("c.pinned DESC, ") : QString()));
  QSqlQuery& rows = query.run();
  QList<ConversationRecord> records;
  while (rows.next()) records.append(conversation_from_row(rows));
  return records;
}

std::optional<ConversationRecord> ConversationStore::conversation(qint64 conversation_id) const {
  QSqlDatabase db = connection(connection_name_);
  StoreQuery query(db, database_path_, QStringLiteral("cannot read conversation %1").arg(conversation_id),
                   conversation_columns(has_pinned_column_) + QStringLiteral(" WHERE c.id = :id"));
  query.bind(QStringLiteral(":id"), conversation_id);
  QSqlQuery& rows = query.run();
  if (!rows.next()) return std::nullopt;
  ConversationRecord record = conversation_from_row(rows);
  rows.finish();
  record.generation_settings = generation_settings(conversation_id);
  record.reply_format = reply_format(conversation_id);
  return record;
}

namespace {
std::atomic<qint64> message_list_reads_so_far{0};
}  // namespace

qint64 ConversationStore::message_list_reads() { return message_list_reads_so_far.load(); }

QList<MessageRecord> ConversationStore::messages(qint64 conversation_id) const {
  message_list_reads_so_far.fetch_add(1);
  QSqlDatabase db = connection(connection_name_);
  // A damaged file's index may have lost entries its table still holds: it is read from the table itself.
  const QString source = damage_.isEmpty() ? QString() : QStringLiteral(" NOT INDEXED");
  StoreQuery query(db, database_path_,
                   QStringLiteral("cannot read the messages of conversation %1").arg(conversation_id),
                   message_columns(has_backend_column_, has_token_columns_, has_branch_columns_, has_tool_use_column_) +
                       source + QStringLiteral(" WHERE conversation_id = :id ORDER BY id"));
  query.bind(QStringLiteral(":id"), conversation_id);
  QSqlQuery& rows = query.run();
  QList<MessageRecord> records;
  while (rows.next()) records.append(message_from_row(rows, database_path_));
  return records;
}

std::optional<MessageRecord> ConversationStore::message(qint64 message_id) const {
  QSqlDatabase db = connection(connection_name_);
  StoreQuery query(db, database_path_, QStringLiteral("cannot read message %1").arg(message_id),
                   message_columns(has_backend_column_, has_token_columns_, has_branch_columns_, has_tool_use_column_) +
                       QStringLiteral(" WHERE id = :id"));
  query.bind(QStringLiteral(":id"), message_id);
  QSqlQuery& rows = query.run();
  if (!rows.next()) return std::nullopt;
  return message_from_row(rows, database_path_);
}

qint64 ConversationStore::add_message(const MessageRecord& message) {
  const QString purpose = QStringLiteral("cannot add a message to conversation %1").arg(message.conversation_id);
  QSqlDatabase db = connection(connection_name_);
  WriteTransaction transaction(db, database_path_, purpose);
  StoreQuery exists(db, database_path_, purpose, QStringLiteral("SELECT 1 FROM conversations WHERE id = :id"));
  exists.bind(QStringLiteral(":id"), message.conversation_id);
  if (!exists.single_value().isValid()) fail(database_path_, purpose + QStringLiteral(": no such conversation"));

  const qint64 created = message.created_at.isValid() ? message.created_at.toMSecsSinceEpoch() : now_ms();
  const qint64 branch = branch_for_new_message(branch_records(db, database_path_, purpose, message.conversation_id));
  StoreQuery insert(
      db, database_path_, purpose,
      QStringLiteral("INSERT INTO messages"
                     " (conversation_id, role, text, created_at, model, backend, settings, stats, complete,"
                     " token_ids, token_vocabulary, tool_use, branch)"
                     " VALUES (:conversation_id, :role, :text, :created_at, :model, :backend, :settings,"
                     " :stats, :complete, :token_ids, :token_vocabulary, :tool_use, :branch)"));
  bind_message_columns(insert, message, message.conversation_id, created).bind(QStringLiteral(":branch"), branch);
  const qint64 id = insert.run().lastInsertId().toLongLong();
  touch_conversation(db, database_path_, message.conversation_id);
  transaction.commit();
  return id;
}

qint64 ConversationStore::fork_message(qint64 conversation_id, qint64 message_id, const QString& text) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose =
      QStringLiteral("cannot edit message %1 of conversation %2").arg(message_id).arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  const QList<MessageRecord> records = branch_records(db, database_path_, purpose, conversation_id);
  const auto edited =
      std::find_if(records.cbegin(), records.cend(), [&](const MessageRecord& r) { return r.id == message_id; });
  if (edited == records.cend() || edited->role != MessageRole::User)
    fail(database_path_, purpose + QStringLiteral(": no user message %1 in it").arg(message_id));
  const qint64 original = edited->forked_from != 0 ? edited->forked_from : edited->id;
  for (const MessageRecord& record : records)
    if (record.role == MessageRole::User && (record.id == original || record.forked_from == original))
      set_branch_hidden(db, database_path_, purpose, record, true);
  StoreQuery insert(db, database_path_, purpose,
                    QStringLiteral("INSERT INTO messages (conversation_id, role, text, created_at, forked_from)"
                                   " VALUES (:conversation_id, 'user', :text, :created_at, :forked_from)"));
  insert.bind(QStringLiteral(":conversation_id"), conversation_id)
      .bind(QStringLiteral(":text"), non_null(text))
      .bind(QStringLiteral(":created_at"), now_ms())
      .bind(QStringLiteral(":forked_from"), original);
  const qint64 id = insert.run().lastInsertId().toLongLong();
  StoreQuery(db, database_path_, purpose, QStringLiteral("UPDATE messages SET branch = id WHERE id = :id"))
      .bind(QStringLiteral(":id"), id)
      .run();
  touch_conversation(db, database_path_, conversation_id);
  transaction.commit();
  spdlog::debug("conversation store: message {} edited as {}, a new branch of conversation {}", message_id, id,
                conversation_id);
  return id;
}

void ConversationStore::show_branch(qint64 conversation_id, qint64 message_id) {
  const QString purpose =
      QStringLiteral("cannot show branch %1 of conversation %2").arg(message_id).arg(conversation_id);
  BranchGroupWrite write(connection(connection_name_), database_path_, purpose, conversation_id, message_id);
  for (const MessageRecord& record : write.records)
    if (write.group.contains(record.id))
      set_branch_hidden(write.db, database_path_, purpose, record, record.id != message_id);
  write.transaction.commit();
}

void ConversationStore::delete_branch(qint64 conversation_id, qint64 message_id) {
  const QString purpose =
      QStringLiteral("cannot delete branch %1 of conversation %2").arg(message_id).arg(conversation_id);
  BranchGroupWrite write(connection(connection_name_), database_path_, purpose, conversation_id, message_id);
  const QSqlDatabase& db = write.db;
  const QList<MessageRecord>& records = write.records;
  const QList<qint64>& group = write.group;
  const QList<qint64> doomed = branch_subtree(records, message_id);
  const QList<MessageRecord> shown = messages_on_shown_path(records);
  const bool was_shown =
      std::any_of(shown.cbegin(), shown.cend(), [&](const MessageRecord& r) { return r.id == message_id; });
  for (const qint64 id : doomed)
    StoreQuery(db, database_path_, purpose, QStringLiteral("DELETE FROM messages WHERE id = :id"))
        .bind(QStringLiteral(":id"), id)
        .run();
  QList<qint64> remaining = group;
  remaining.removeAll(message_id);
  const auto record_of = [&](qint64 id) {
    return *std::find_if(records.cbegin(), records.cend(), [&](const MessageRecord& r) { return r.id == id; });
  };
  const MessageRecord deleted = record_of(message_id);
  if (deleted.forked_from == 0) {
    // The original goes: its oldest edit takes its place in the original's branch. Every message of that edit's
    // branch has a later id than the ones left in the original's branch, so their order stays right.
    const MessageRecord heir = record_of(remaining.front());
    StoreQuery(db, database_path_, purpose,
               QStringLiteral("UPDATE messages SET branch = :to WHERE branch = :from"
                              " AND conversation_id = :conversation_id"))
        .bind(QStringLiteral(":to"), deleted.branch)
        .bind(QStringLiteral(":from"), heir.id)
        .bind(QStringLiteral(":conversation_id"), conversation_id)
        .run();
    StoreQuery(db, database_path_, purpose,
               QStringLiteral("UPDATE messages SET forked_from = CASE WHEN id = :heir THEN 0 ELSE :heir END"
                              " WHERE forked_from = :original AND conversation_id = :conversation_id"))
        .bind(QStringLiteral(":heir"), heir.id)
        .bind(QStringLiteral(":original"), deleted.id)
        .bind(QStringLiteral(":conversation_id"), conversation_id)
        .run();
  }
  if (was_shown || remaining.size() == 1)
    for (const qint64 id : remaining)
      set_branch_hidden(db, database_path_, purpose, record_of(id), id != remaining.back() && remaining.size() > 1);
  touch_conversation(db, database_path_, conversation_id);
  write.transaction.commit();
  spdlog::debug("conversation store: deleted branch {} ({} messages) of conversation {}", message_id, doomed.size(),
                conversation_id);
}

void ConversationStore::update_message_text(qint64 message_id, const QString& text) {
  // Called about once a second while a reply streams: one statement, one commit, nothing else.
  const QString purpose = QStringLiteral("cannot update message %1").arg(message_id);
  QSqlDatabase db = connection(connection_name_);
  WriteTransaction transaction(db, database_path_, purpose);
  StoreQuery update(db, database_path_, purpose,
                    QStringLiteral("UPDATE messages SET text = :text, token_ids = NULL, token_vocabulary = 0"
                                   " WHERE id = :id"));
  update.bind(QStringLiteral(":text"), non_null(text)).bind(QStringLiteral(":id"), message_id);
  require_rows_affected(update.run(), database_path_, QStringLiteral("no message %1").arg(message_id));
  transaction.commit();
}

void ConversationStore::set_message_origin(qint64 message_id, const QString& backend, const QString& model) {
  update_message_columns(message_id, QStringLiteral("cannot record who answered message %1").arg(message_id),
                         {{QStringLiteral("backend"), non_null(backend)}, {QStringLiteral("model"), non_null(model)}});
}

void ConversationStore::update_message_columns(qint64 message_id, const QString& purpose,
                                               const QList<QPair<QString, QString>>& values) {
  QSqlDatabase db = connection(connection_name_);
  WriteTransaction transaction(db, database_path_, purpose);
  QStringList assignments;
  for (int i = 0; i < values.size(); ++i) assignments << QStringLiteral("%1 = :value%2").arg(values[i].first).arg(i);
  StoreQuery update(
      db, database_path_, purpose,
      QStringLiteral("UPDATE messages SET %1 WHERE id = :id").arg(assignments.join(QStringLiteral(", "))));
  for (int i = 0; i < values.size(); ++i) update.bind(QStringLiteral(":value%1").arg(i), values[i].second);
  update.bind(QStringLiteral(":id"), message_id);
  require_rows_affected(update.run(), database_path_, QStringLiteral("no message %1").arg(message_id));
  transaction.commit();
}

void ConversationStore::finish_message(qint64 message_id, const QString& text, const QJsonObject& stats,
                                       const std::vector<TokenId>& token_ids, quint64 token_vocabulary) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot finish message %1").arg(message_id);
  WriteTransaction transaction(db, database_path_, purpose);
  StoreQuery owner(db, database_path_, purpose, QStringLiteral("SELECT conversation_id FROM messages WHERE id = :id"));
  owner.bind(QStringLiteral(":id"), message_id);
  const QVariant owner_id = owner.single_value();
  if (!owner_id.isValid()) fail(database_path_, QStringLiteral("no message %1").arg(message_id));
  const qint64 conversation_id = owner_id.toLongLong();
  StoreQuery(db, database_path_, purpose,
             QStringLiteral("UPDATE messages SET text = :text, stats = :stats, complete = 1, token_ids = :token_ids,"
                            " token_vocabulary = :token_vocabulary WHERE id = :id"))
      .bind(QStringLiteral(":text"), non_null(text))
      .bind(QStringLiteral(":stats"), json_text(stats))
      .bind(QStringLiteral(":token_ids"), token_ids_column(token_ids))
      .bind(QStringLiteral(":token_vocabulary"), token_ids.empty() ? 0 : static_cast<qint64>(token_vocabulary))
      .bind(QStringLiteral(":id"), message_id)
      .run();
  touch_conversation(db, database_path_, conversation_id);
  transaction.commit();
}

void ConversationStore::delete_messages_from(qint64 conversation_id, qint64 first_message_id) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose =
      QStringLiteral("cannot delete messages from %1 in conversation %2").arg(first_message_id).arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  StoreQuery owner(db, database_path_, purpose, QStringLiteral("SELECT conversation_id FROM messages WHERE id = :id"));
  owner.bind(QStringLiteral(":id"), first_message_id);
  const QVariant owner_id = owner.single_value();
  if (!owner_id.isValid() || owner_id.toLongLong() != conversation_id)
    fail(database_path_, QStringLiteral("no message %1 in conversation %2").arg(first_message_id).arg(conversation_id));
  StoreQuery(db, database_path_, purpose,
             QStringLiteral("DELETE FROM messages WHERE conversation_id = :conversation_id AND id >= :first"))
      .bind(QStringLiteral(":conversation_id"), conversation_id)
      .bind(QStringLiteral(":first"), first_message_id)
      .run();
  touch_conversation(db, database_path_, conversation_id);
  transaction.commit();
}

void ConversationStore::delete_messages(qint64 conversation_id, const QList<qint64>& message_ids) {
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot delete messages of conversation %1").arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  for (const qint64 message_id : message_ids) {
    StoreQuery remove(db, database_path_, purpose,
                      QStringLiteral("DELETE FROM messages WHERE id = :id AND conversation_id = :conversation_id"));
    remove.bind(QStringLiteral(":id"), message_id).bind(QStringLiteral(":conversation_id"), conversation_id);
    require_rows_affected(remove.run(), database_path_,
                          QStringLiteral("no message %1 in conversation %2").arg(message_id).arg(conversation_id));
  }
  touch_conversation(db, database_path_, conversation_id);
  transaction.commit();
}

qint64 ConversationStore::duplicate_conversation(qint64 conversation_id) {
  const std::optional<ConversationRecord> original = conversation(conversation_id);
  if (!original) fail(database_path_, QStringLiteral("no conversation %1").arg(conversation_id));
  const QList<MessageRecord> originals = messages(conversation_id);
  QSqlDatabase db = connection(connection_name_);
  const QString purpose = QStringLiteral("cannot copy conversation %1").arg(conversation_id);
  WriteTransaction transaction(db, database_path_, purpose);
  const qint64 now = now_ms();
  const QJsonObject generation = original->generation_settings;
  StoreQuery insert(db, database_path_, purpose,
                    QStringLiteral("INSERT INTO conversations (title, system_prompt, created_at, updated_at, activity,"
                                   " generation_settings, reply_format)"
                                   " VALUES (:title, :system_prompt, :now, :now, :activity, :generation,"
                                   " :reply_format)"));
  insert.bind(QStringLiteral(":title"), original->title + QStringLiteral(" (copy)"))
      .bind(QStringLiteral(":system_prompt"), non_null(original->system_prompt))
      .bind(QStringLiteral(":now"), now)
      .bind(QStringLiteral(":activity"), next_activity(db, database_path_))
      .bind(QStringLiteral(":generation"), generation.isEmpty() ? QStringLiteral("") : json_text(generation))
      .bind(QStringLiteral(":reply_format"),
            original->reply_format.isEmpty() ? QStringLiteral("") : json_text(original->reply_format));
  const qint64 copy_id = insert.run().lastInsertId().toLongLong();
  // Ids are never reused, so the copies keep their originals' order; a marker's context start is a message
  // id, mapped to its copy once every copy has one.
  QHash<qint64, qint64> copy_of;
  for (const MessageRecord& message : originals) {
    // A branch starts at a message, and an edit refers to its original: both are earlier, so already copied.
    StoreQuery copy(db, database_path_, purpose,
                    QStringLiteral("INSERT INTO messages (conversation_id, role, text, created_at, model, backend,"
                                   " settings, stats, complete, token_ids, token_vocabulary, tool_use, branch,"
                                   " forked_from) SELECT :copy_id, role, text, created_at, model, backend, settings,"
                                   " stats, complete, token_ids, token_vocabulary, tool_use, :branch, :forked_from"
                                   " FROM messages"
                                   " WHERE id = :id"));
    copy.bind(QStringLiteral(":copy_id"), copy_id)
        .bind(QStringLiteral(":branch"), message.branch == message.id ? -1 : copy_of.value(message.branch, 0))
        .bind(QStringLiteral(":forked_from"), copy_of.value(message.forked_from, 0))
        .bind(QStringLiteral(":id"), message.id);
    const qint64 copied = copy.run().lastInsertId().toLongLong();
    copy_of.insert(message.id, copied);
    if (message.branch == message.id)
      StoreQuery(db, database_path_, purpose, QStringLiteral("UPDATE messages SET branch = id WHERE id = :id"))
          .bind(QStringLiteral(":id"), copied)
          .run();
  }
  for (const MessageRecord& message : originals) {
    if (message.role != MessageRole::Marker || !message.settings.contains(QLatin1String(kMarkerContextStartKey)))
      continue;
    const qint64 start = message.settings.value(QLatin1String(kMarkerContextStartKey)).toInteger();
    QJsonObject settings = message.settings;
    // A start the chat no longer holds (its message deleted): the first copied message after it.
    qint64 mapped = 0;
    for (const MessageRecord& later : originals)
      if (later.id >= start) {
        mapped = copy_of.value(later.id);
        break;
      }
    settings.insert(QLatin1String(kMarkerContextStartKey), mapped > 0 ? mapped : copy_of.value(message.id));
    StoreQuery(db, database_path_, purpose, QStringLiteral("UPDATE messages SET settings = :settings WHERE id = :id"))
        .bind(QStringLiteral(":settings"), json_text(settings))
        .bind(QStringLiteral(":id"), copy_of.value(message.id))
        .run();
  }
  transaction.commit();
  spdlog::debug("conversation store: copied conversation {} to {}", conversation_id, copy_id);
  return copy_id;
}

QList<qint64> ConversationStore::import_conversations(const QList<ImportedConversation>& conversations) {
  QSqlDatabase db = connection(connection_name_);
  WriteTransaction transaction(db, database_path_, QStringLiteral("cannot import conversations"));
  QList<qint64> ids(conversations.size(), 0);
  // The last first: each import is more recent than the one before, so the first is listed first.
  for (qsizetype index = conversations.size() - 1; index >= 0; --index) {
    const ConversationRecord& record = conversations[index].conversation;
    const QString purpose =
        QStringLiteral("cannot import conversation %1 (\u201c%2\u201d)").arg(index + 1).arg(record.title);
    const qint64 now = now_ms();
    StoreQuery insert(
        db, database_path_, purpose,
        QStringLiteral("INSERT INTO conversations (title, system_prompt, created_at, updated_at, activity,"
                       " pinned, generation_settings, reply_format) VALUES (:title, :system_prompt, :created_at,"
                       " :updated_at, :activity, :pinned, :generation_settings, :reply_format)"));
    insert.bind(QStringLiteral(":title"), non_null(record.title))
        .bind(QStringLiteral(":system_prompt"), non_null(record.system_prompt))
        .bind(QStringLiteral(":created_at"), record.created_at.isValid() ? record.created_at.toMSecsSinceEpoch() : now)
        .bind(QStringLiteral(":updated_at"), record.updated_at.isValid() ? record.updated_at.toMSecsSinceEpoch() : now)
        .bind(QStringLiteral(":activity"), next_activity(db, database_path_))
        .bind(QStringLiteral(":pinned"), record.pinned ? 1 : 0)
        .bind(QStringLiteral(":generation_settings"),
              record.generation_settings.isEmpty() ? QStringLiteral("") : json_text(record.generation_settings))
        .bind(QStringLiteral(":reply_format"),
              record.reply_format.isEmpty() ? QStringLiteral("") : json_text(record.reply_format));
    const qint64 conversation_id = insert.run().lastInsertId().toLongLong();
    ids[index] = conversation_id;
    QHash<qint64, qint64> new_id;
    const auto mapped = [&](qint64 local, const MessageRecord& message, const char* what) -> qint64 {
      if (local == 0) return 0;
      if (!new_id.contains(local))
        fail(database_path_, purpose + QStringLiteral(": message %1's %2 refers to message %3, which it does not hold")
                                           .arg(message.id)
                                           .arg(QLatin1String(what))
                                           .arg(local));
      return new_id.value(local);
    };
    for (const MessageRecord& message : conversations[index].messages) {
      if (new_id.contains(message.id))
        fail(database_path_, purpose + QStringLiteral(": message %1 is listed twice").arg(message.id));
      StoreQuery add(db, database_path_, purpose,
                     QStringLiteral("INSERT INTO messages (conversation_id, role, text, created_at, model, backend,"
                                    " settings, stats, complete, token_ids, token_vocabulary, tool_use)"
                                    " VALUES (:conversation_id, :role, :text, :created_at, :model, :backend, :settings,"
                                    " :stats, :complete, :token_ids, :token_vocabulary, :tool_use)"));
      bind_message_columns(add, message, conversation_id,
                           message.created_at.isValid() ? message.created_at.toMSecsSinceEpoch() : now);
      new_id.insert(message.id, add.run().lastInsertId().toLongLong());
    }
    // References are mapped once every message has its id (a marker's context start may come after it).
    for (const MessageRecord& message : conversations[index].messages) {
      const qint64 branch =
          message.branch == message.id ? new_id.value(message.id) : mapped(message.branch, message, "branch");
      const qint64 forked_from = mapped(message.forked_from, message, "forked_from");
      QJsonObject settings = message.settings;
      if (message.role == MessageRole::Marker && settings.contains(QLatin1String(kMarkerContextStartKey)))
        settings.insert(
            QLatin1String(kMarkerContextStartKey),
            mapped(settings.value(QLatin1String(kMarkerContextStartKey)).toInteger(), message, kMarkerContextStartKey));
      if (branch == 0 && forked_from == 0 && settings == message.settings) continue;
      StoreQuery(db, database_path_, purpose,
                 QStringLiteral("UPDATE messages SET branch = :branch, forked_from = :forked_from, settings = :settings"
                                " WHERE id = :id"))
          .bind(QStringLiteral(":branch"), branch)
          .bind(QStringLiteral(":forked_from"), forked_from)
          .bind(QStringLiteral(":settings"), json_text(settings))
          .bind(QStringLiteral(":id"), new_id.value(message.id))
          .run();
    }
  }
  transaction.commit();
  spdlog::info("conversation store {}: imported {} conversation(s)", database_path_.toStdString(),
               conversations.size());
  return ids;
}

void ConversationStore::set_message_settings(qint64 message_id, const QJsonObject& settings) {
  update_message_columns(message_id, QStringLiteral("cannot update the settings of message %1").arg(message_id),
                         {{QStringLiteral("settings"), json_text(settings)}});
}

QList<SearchHit> ConversationStore::search(const QString& query) const {
  // Each typed word becomes an FTS5 string ("..." with its quotes doubled) with a prefix star: operators and
  // special characters inside it are text. A word without a letter or digit has no FTS5 token (it would
  // match nothing): it is looked for in the text as it is.
  QStringList fts_terms, literal_words;
  for (const QString& word : query.split(QRegularExpression(QStringLiteral("\\s+")), Qt::SkipEmptyParts)) {
    const bool has_token = std::any_of(word.cbegin(), word.cend(), [](QChar c) { return c.isLetterOrNumber(); });
    if (has_token && has_search_index_)
      fts_terms << QStringLiteral("\"%1\"*").arg(QString(word).replace(QLatin1Char('"'), QStringLiteral("\"\"")));
    else
      literal_words << word;
  }
  if (fts_terms.isEmpty() && literal_words.isEmpty()) return {};
  QStringList conditions;
  for (int i = 0; i < literal_words.size(); ++i)
    conditions << (has_search_index_ || !std::any_of(literal_words[i].cbegin(), literal_words[i].cend(),
                                                     [](QChar c) { return c.isLetterOrNumber(); })
                       ? QStringLiteral("instr(m.text, :word%1) > 0").arg(i)
                       : QStringLiteral("instr(lower(m.text), lower(:word%1)) > 0").arg(i));
  QString sql = QStringLiteral("SELECT m.conversation_id, min(m.id) FROM messages m");
  if (!fts_terms.isEmpty()) {
    sql += QStringLiteral(" JOIN messages_fts ON messages_fts.rowid = m.id");
    conditions.prepend(QStringLiteral("messages_fts MATCH :match"));
  }
  sql += QStringLiteral(" WHERE ") + conditions.join(QStringLiteral(" AND ")) +
         QStringLiteral(" GROUP BY m.conversation_id");
  QSqlDatabase db = connection(connection_name_);
  StoreQuery search_query(db, database_path_, QStringLiteral("cannot search the conversations"), sql);
  if (!fts_terms.isEmpty()) search_query.bind(QStringLiteral(":match"), fts_terms.join(QLatin1Char(' ')));
  for (int i = 0; i < literal_words.size(); ++i) search_query.bind(QStringLiteral(":word%1").arg(i), literal_words[i]);
  QSqlQuery& rows = search_query.run();
  QHash<qint64, qint64> first_message;
  while (rows.next()) first_message.insert(rows.value(0).toLongLong(), rows.value(1).toLongLong());
  rows.finish();

  const QStringList words = query.split(QRegularExpression(QStringLiteral("\\s+")), Qt::SkipEmptyParts);
  QList<SearchHit> hits;
  for (const ConversationRecord& record : conversations()) {
    const bool title_matches = std::all_of(words.cbegin(), words.cend(), [&](const QString& word) {
      return record.title.contains(word, Qt::CaseInsensitive);
    });
    if (first_message.contains(record.id) || title_matches) hits.append({record.id, first_message.value(record.id)});
  }
  return hits;
}

QString ConversationStore::integrity_check() const {
  QSqlDatabase db = connection(connection_name_);
  StoreQuery query(db, database_path_, QStringLiteral("integrity check failed"),
                   QStringLiteral("PRAGMA integrity_check"));
  return query.single_value().toString();
}

// Damaged pages make queries return part of the rows without an error: a chat would go on from part of its
// history and write into the damaged file. quick_check reads every page (not the indexes' agreement with
// their tables, which integrity_check adds at a higher cost, paid only once a file has failed the first).
void ConversationStore::check_for_damage(const QSqlDatabase& db, bool read_only) {
  damage_ = check_database(db, QStringLiteral("PRAGMA quick_check(8)"));
  if (damage_.isEmpty()) return;
  const QString thorough = check_database(db, QStringLiteral("PRAGMA integrity_check(8)"));
  if (!thorough.isEmpty()) damage_ = thorough;
  // Reported by the caller (the StoreError below, or a reader's damage()): logged here only for the record.
  spdlog::info("conversation store {}: the file is damaged: {}", database_path_.toStdString(), damage_.toStdString());
  if (!read_only)
    fail(database_path_, QStringLiteral("the file is damaged (%1); nothing was written to it. Keep a copy of it: "
                                        "kvchat-cli export can still read what is intact, and sqlite3's .recover "
                                        "command may save more")
                             .arg(damage_));
}

QString ConversationStore::damage() const { return damage_; }

QString ConversationStore::missing_messages(qint64 conversation_id) const {
  if (damage_.isEmpty()) return {};
  QSqlDatabase db = connection(connection_name_);
  // The messages are read through the index; a row it lists that the table lacks, or one the table holds
  // that it does not list, is missing from what messages() returns.
  auto ids = [&](const QString& source) -> std::optional<QList<qint64>> {
    QSqlQuery query(db);
    const QString sql =
        QStringLiteral("SELECT id FROM messages %1 WHERE conversation_id = :id ORDER BY id").arg(source);
    if (!query.prepare(sql)) return std::nullopt;
    query.bindValue(QStringLiteral(":id"), conversation_id);
    if (!query.exec()) return std::nullopt;
    QList<qint64> found;
    while (query.next()) found << query.value(0).toLongLong();
    if (query.lastError().isValid()) return std::nullopt;
    return found;
  };
  const auto listed = ids(QStringLiteral("INDEXED BY messages_by_conversation"));
  const auto stored = ids(QStringLiteral("NOT INDEXED"));
  if (!listed || !stored) return QStringLiteral("its messages cannot all be read (the file is damaged)");
  QStringList unreadable, unlisted;
  for (const qint64 id : *listed)
    if (!stored->contains(id)) unreadable << QString::number(id);
  for (const qint64 id : *stored)
    if (!listed->contains(id)) unlisted << QString::number(id);
  const auto plural = [](const QStringList& ids, const char* one, const char* many) {
    return QString::fromLatin1(ids.size() == 1 ? one : many).arg(ids.join(QStringLiteral(", ")));
  };
  QStringList missing;
  if (!unreadable.isEmpty())
    missing << plural(unreadable, "message %1 cannot be read", "messages %1 cannot be read") +
                   QStringLiteral(" (%1 of the %2 the index lists)").arg(unreadable.size()).arg(listed->size());
  if (!unlisted.isEmpty())
    missing << plural(unlisted, "message %1 is missing from the index (its row was read)",
                      "messages %1 are missing from the index (their rows were read)");
  return missing.join(QStringLiteral("; "));
}

}  // namespace kvchat::app
