#pragma once
// The conversation store's SQL helpers (internal to conversation_store.cpp): statements and write
// transactions whose failures become StoreErrors naming the file, the purpose and SQLite's words.
#include <spdlog/spdlog.h>

#include <QSqlDatabase>
#include <QSqlError>
#include <QSqlQuery>
#include <QString>
#include <QVariant>

#include "app/store/conversation_store.h"

namespace kvchat::app::store_sql {

inline QString sqlite_message(const QSqlError& error) {
  QString text = error.databaseText();
  if (text.isEmpty()) text = error.driverText();
  if (text.isEmpty()) text = error.text();
  return text;
}

// SQLITE_BUSY (5) or SQLITE_LOCKED (6), with any extended code.
inline bool is_busy(const QSqlError& error) {
  const int code = error.nativeErrorCode().toInt();
  return (code & 0xFF) == 5 || (code & 0xFF) == 6;
}

[[noreturn]] inline void fail(const QString& path, const QString& what, const QSqlError& error) {
  throw StoreError(
      QStringLiteral("conversation store %1: %2: %3").arg(path, what, sqlite_message(error)).toStdString());
}

[[noreturn]] inline void fail(const QString& path, const QString& what) {
  throw StoreError(QStringLiteral("conversation store %1: %2").arg(path, what).toStdString());
}

// Binds and runs one statement; a failure becomes a StoreError naming the file and the statement's purpose.
class StoreQuery {
 public:
  StoreQuery(const QSqlDatabase& db, const QString& path, const QString& purpose, const QString& sql)
      : query_(db), path_(path), purpose_(purpose) {
    if (!query_.prepare(sql)) fail(path_, purpose_, query_.lastError());
  }
  StoreQuery& bind(const QString& name, const QVariant& value) {
    query_.bindValue(name, value);
    return *this;
  }
  QSqlQuery& run() {
    if (!query_.exec()) fail(path_, purpose_, query_.lastError());
    return query_;
  }
  // Runs the statement and returns the first column of its first row (invalid when there is no row).
  // The statement is finished before returning: a statement left open would block the commit.
  QVariant single_value() {
    run();
    QVariant value = query_.next() ? query_.value(0) : QVariant();
    query_.finish();
    return value;
  }

 private:
  QSqlQuery query_;
  QString path_;
  QString purpose_;
};

// How long a write waits for another connection (a second window, the CLI) to finish its own: SQLite's
// busy timeout per attempt, and the attempts before giving up.
constexpr int kBusyTimeoutMs = 5000;
constexpr int kWriteAttempts = 6;

// One write = one transaction: committed by commit(), rolled back if an exception leaves the scope first.
//
// BEGIN IMMEDIATE takes the write lock at the start. A plain (deferred) BEGIN reads first and asks for
// the lock at the first write; in WAL mode, when another connection has committed in between, SQLite
// answers "database is locked" at once, without waiting, because the read snapshot is stale. Waiting
// for the lock up front lets the busy timeout work, and a write that still finds the database busy
// tries again before it fails.
class WriteTransaction {
 public:
  WriteTransaction(QSqlDatabase db, const QString& path, const QString& purpose)
      : db_(std::move(db)), path_(path), purpose_(purpose) {
    for (int attempt = 1;; ++attempt) {
      QSqlQuery begin(db_);
      if (begin.exec(QStringLiteral("BEGIN IMMEDIATE"))) break;
      if (attempt == kWriteAttempts || !is_busy(begin.lastError()))
        fail(path_, purpose_ + QStringLiteral(" (begin)"), begin.lastError());
      spdlog::warn("conversation store {}: database busy for {} s ({}); trying again", path_.toStdString(),
                   attempt * kBusyTimeoutMs / 1000, purpose_.toStdString());
    }
  }
  ~WriteTransaction() {
    if (committed_) return;
    QSqlQuery rollback(db_);
    if (!rollback.exec(QStringLiteral("ROLLBACK")))
      spdlog::warn("conversation store {}: rollback after failed {} failed: {}", path_.toStdString(),
                   purpose_.toStdString(), sqlite_message(rollback.lastError()).toStdString());
  }
  void commit() {
    QSqlQuery commit(db_);
    if (!commit.exec(QStringLiteral("COMMIT"))) fail(path_, purpose_ + QStringLiteral(" (commit)"), commit.lastError());
    committed_ = true;
  }

 private:
  QSqlDatabase db_;
  QString path_;
  QString purpose_;
  bool committed_ = false;
};

}  // namespace kvchat::app::store_sql
