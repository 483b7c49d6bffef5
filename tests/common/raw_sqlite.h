#pragma once
// Reading and writing a SQLite file through a separate, raw connection: what another program sees
// of (or does to) a conversation store.
#include <QRandomGenerator>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QString>

namespace kvchat::test {

// Runs one SQL statement; returns the first column of its first row ("" when none or on error).
inline QString raw_query(const QString& path, const QString& sql) {
  const QString name = QStringLiteral("raw-%1").arg(QRandomGenerator::global()->generate64());
  QString result;
  {
    QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), name);
    db.setDatabaseName(path);
    if (db.open()) {
      QSqlQuery query(db);
      if (query.exec(sql) && query.next()) result = query.value(0).toString();
    }
    db.close();
  }
  QSqlDatabase::removeDatabase(name);
  return result;
}

}  // namespace kvchat::test
