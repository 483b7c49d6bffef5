#include "ui/message_list_model.h"

#include <algorithm>
#include <vector>

#include "app/store/chat_history.h"
#include "app/store/message_role.h"

namespace kvchat::ui {

using kvchat::app::MessageRecord;
using kvchat::app::MessageRole;

namespace {

// Which of `rows` to keep: a longest subsequence whose positions in the new list (`position`; absent: not wanted)
// increase. Patience sorting, O(n log n).
template <typename Row>
std::vector<bool> rows_in_order(const QList<Row>& rows, const QHash<qint64, int>& position) {
  std::vector<int> tails;  // tails[k]: the row ending the best run of length k + 1 found so far
  std::vector<int> previous(rows.size(), -1);
  const auto at = [&](int row) { return position.value(rows[row].record.id, -1); };
  for (int row = 0; row < rows.size(); ++row) {
    const int new_position = at(row);
    if (new_position < 0) continue;
    const auto slot = std::lower_bound(tails.begin(), tails.end(), new_position,
                                       [&](int tail_row, int value) { return at(tail_row) < value; });
    if (slot != tails.begin()) previous[row] = *(slot - 1);
    if (slot == tails.end())
      tails.push_back(row);
    else
      *slot = row;
  }
  std::vector<bool> keep(rows.size(), false);
  for (int row = tails.empty() ? -1 : tails.back(); row >= 0; row = previous[row]) keep[row] = true;
  return keep;
}

}  // namespace

MessageListModel::MessageListModel(QObject* parent) : QAbstractListModel(parent) {}

int MessageListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

QVariant MessageListModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() < 0 || index.row() >= rows_.size()) return {};
  const Row& row = rows_[index.row()];
  switch (role) {
    case Qt::DisplayRole: return row.record.text;
    case MessageIdRole: return row.record.id;
    case MessageRoleRole: return kvchat::app::role_name(row.record.role);
    case StreamingRole: return row.streaming;
    case CompleteRole: return row.record.complete;
    default: return {};
  }
}

QHash<int, QByteArray> MessageListModel::roleNames() const {
  QHash<int, QByteArray> names = QAbstractListModel::roleNames();
  names.insert(MessageIdRole, "messageId");
  names.insert(MessageRoleRole, "role");
  names.insert(StreamingRole, "streaming");
  names.insert(CompleteRole, "complete");
  return names;
}

bool MessageListModel::shows_the_same(const Row& a, const Row& b) {
  const MessageRecord& x = a.record;
  const MessageRecord& y = b.record;
  return a.streaming == b.streaming && a.branches == b.branches && a.alternatives == b.alternatives &&
         x.text == y.text && x.complete == y.complete && x.stats == y.stats && x.settings == y.settings &&
         x.model == y.model && x.backend == y.backend && x.created_at == y.created_at;
}

void MessageListModel::setMessages(const QList<MessageRecord>& messages, qint64 streaming_message_id,
                                   const QString& streaming_text, const QHash<qint64, QList<qint64>>& branches) {
  QList<Row> wanted;
  QHash<qint64, int> position;  // id -> index in `wanted`
  for (const MessageRecord& message : kvchat::app::messages_in_reading_order(messages)) {
    Row row{message, message.id == streaming_message_id, {}, {}};
    if (row.streaming && !streaming_text.isEmpty()) row.record.text = streaming_text;
    if (message.role == MessageRole::User) row.branches = branches.value(message.id);
    if (message.role == MessageRole::Assistant)
      row.alternatives = kvchat::app::reply_alternatives(messages, message.id);
    position.insert(message.id, static_cast<int>(wanted.size()));
    wanted.push_back(std::move(row));
  }
  // Rows that stay must keep their order: the most rows that are still wanted and already in the wanted order
  // stay (a longest increasing run of their new positions); the others go, each run of them in one removal.
  const std::vector<bool> keep = rows_in_order(rows_, position);
  for (int end = static_cast<int>(rows_.size()) - 1; end >= 0;) {
    if (keep[end]) {
      --end;
      continue;
    }
    int first = end;
    while (first > 0 && !keep[first - 1]) --first;
    beginRemoveRows(QModelIndex(), first, end);
    rows_.erase(rows_.begin() + first, rows_.begin() + end + 1);
    endRemoveRows();
    end = first - 1;
  }
  // The rows kept are now a subsequence of `wanted`: insert what is missing, each run in one insertion, and
  // report a kept row that shows something else now.
  for (int at = 0; at < wanted.size();) {
    if (at < rows_.size() && rows_[at].record.id == wanted[at].record.id) {
      if (!shows_the_same(rows_[at], wanted[at])) {
        rows_[at] = wanted[at];
        Q_EMIT dataChanged(index(at), index(at));
      }
      ++at;
      continue;
    }
    int end = at;  // the run of wanted rows before the next kept one
    const qint64 next_kept = at < rows_.size() ? rows_[at].record.id : 0;
    while (end + 1 < wanted.size() && wanted[end + 1].record.id != next_kept) ++end;
    beginInsertRows(QModelIndex(), at, end);
    for (int i = at; i <= end; ++i) rows_.insert(i, wanted[i]);
    endInsertRows();
    at = end + 1;
  }
  Q_EMIT messagesSet();
}

void MessageListModel::appendText(qint64 message_id, const QString& chunk) {
  const int row = rowOf(message_id);
  if (row < 0 || chunk.isEmpty()) return;
  rows_[row].record.text += chunk;
  Q_EMIT dataChanged(index(row), index(row), {Qt::DisplayRole});
}

void MessageListModel::updateMessage(const MessageRecord& message) {
  const int row = rowOf(message.id);
  if (row < 0) return;
  rows_[row].record = message;
  rows_[row].streaming = false;
  Q_EMIT dataChanged(index(row), index(row));
}

int MessageListModel::rowOf(qint64 message_id) const {
  // From the end: what changes while a chat is shown is mostly its last reply.
  for (int row = static_cast<int>(rows_.size()) - 1; row >= 0; --row)
    if (rows_[row].record.id == message_id) return row;
  return -1;
}

}  // namespace kvchat::ui
