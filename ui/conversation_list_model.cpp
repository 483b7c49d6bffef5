#include "ui/conversation_list_model.h"

#include <QLocale>
#include <QScopedValueRollback>

#include "app/chat/chat_controller.h"
#include "ui/conversation_titles.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

using kvchat::app::ChatController;
using kvchat::app::ConversationRecord;

bool ConversationListModel::Row::operator==(const Row& other) const {
  return record.id == other.record.id && record.title == other.record.title &&
         record.updated_at == other.record.updated_at && record.message_count == other.record.message_count &&
         record.pinned == other.record.pinned && title == other.title && state == other.state && held == other.held &&
         held_tokens == other.held_tokens && held_bytes == other.held_bytes && first_match == other.first_match;
}

ConversationListModel::ConversationListModel(ChatController* controller, QObject* parent)
    : QAbstractListModel(parent), controller_(controller) {}

int ConversationListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

QVariant ConversationListModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() < 0 || index.row() >= rows_.size()) return {};
  const Row& row = rows_[index.row()];
  switch (role) {
    case Qt::DisplayRole: return display_text(row);
    case Qt::ToolTipRole: return tooltip(row);
    case ConversationIdRole: return row.record.id;
    case HeldCacheBytesRole: return row.held ? row.held_bytes : qint64{0};
    case PinnedRole: return row.record.pinned;
    case FirstMatchRole: return row.first_match;
    case BusyRole: return !row.state.isEmpty();
    default: return {};
  }
}

QString ConversationListModel::display_text(const Row& row) const {
  QString text = row.title;
  if (!row.state.isEmpty()) text = QStringLiteral("%1 \u00b7 %2").arg(text, row.state);
  // Pinned chats lead the list (the store orders them): the marker says why they stay there.
  return row.record.pinned ? pinned_marker() + text : text;
}

QString ConversationListModel::tooltip(const Row& row) const {
  const ConversationRecord& conversation = row.record;
  QString text = tr("%1\n%2 messages, last active %3")
                     .arg(conversation.title)
                     .arg(conversation.message_count)
                     .arg(QLocale().toString(conversation.updated_at.toLocalTime(), QLocale::ShortFormat));
  if (conversation.pinned) text += tr("\nPinned: listed first");
  // Which chats hold a cache now, and how much (Chat > Caches in memory lists them all).
  if (row.held)
    text += tr("\nKV cache in memory: %1 tokens, %2").arg(row.held_tokens).arg(format_bytes(row.held_bytes));
  else
    text += tr("\nNo KV cache in memory (the next reply prefills the chat)");
  return text;
}

void ConversationListModel::fill_states(Row& row) const {
  const qint64 id = row.record.id;
  row.state.clear();
  if (controller_->isGenerating() && controller_->generatingConversationId() == id)
    row.state = tr("generating\u2026");
  else if (controller_->isQueued(id))
    row.state = tr("waiting\u2026");
  row.held = false;
  row.held_tokens = row.held_bytes = 0;
  for (const ChatController::HeldCache& cache : controller_->heldCaches())
    if (cache.conversation_id == id) {
      row.held = true;
      row.held_tokens = cache.tokens;
      row.held_bytes = cache.bytes;
    }
}

void ConversationListModel::reload(const QString& search) {
  conversations_ = controller_->conversations();
  found_.clear();
  searching_ = !search.isEmpty();
  if (searching_)
    for (const kvchat::app::SearchHit& hit : controller_->searchConversations(search))
      found_.insert(hit.conversation_id, hit.first_message_id);
  refresh_states();
}

void ConversationListModel::refresh_states() {
  // A view's slot may call back while rows change (its current row removed): the rows are brought up to date
  // once the change in progress is done.
  if (applying_) {
    again_ = true;
    return;
  }
  const QScopedValueRollback<bool> applying(applying_, true);
  const QHash<qint64, QString> titles = distinguishable_titles(conversations_);
  QList<Row> wanted;
  for (const ConversationRecord& conversation : conversations_) {
    if (searching_ && !found_.contains(conversation.id)) continue;
    Row row;
    row.record = conversation;
    row.title = titles.value(conversation.id);
    row.first_match = found_.value(conversation.id);
    fill_states(row);
    wanted.push_back(std::move(row));
  }
  apply(std::move(wanted));
  if (again_) {
    again_ = false;
    applying_ = false;
    refresh_states();
  }
}

// Brings rows_ to `wanted` with removals, moves, insertions and dataChanged, in that order, so that a view
// keeps its current row (a persistent index) through a reorder.
void ConversationListModel::apply(QList<Row> wanted) {
  QHash<qint64, int> wanted_rows;
  for (int i = 0; i < wanted.size(); ++i) wanted_rows.insert(wanted[i].record.id, i);
  for (int i = static_cast<int>(rows_.size()) - 1; i >= 0; --i)
    if (!wanted_rows.contains(rows_[i].record.id)) {
      beginRemoveRows(QModelIndex(), i, i);
      rows_.removeAt(i);
      endRemoveRows();
    }
  for (int target = 0; target < wanted.size(); ++target) {
    const qint64 id = wanted[target].record.id;
    int found = -1;
    for (int i = target; i < rows_.size(); ++i)
      if (rows_[i].record.id == id) {
        found = i;
        break;
      }
    if (found < 0) {
      beginInsertRows(QModelIndex(), target, target);
      rows_.insert(target, wanted[target]);
      endInsertRows();
      continue;
    }
    if (found != target) {
      beginMoveRows(QModelIndex(), found, found, QModelIndex(), target);
      rows_.move(found, target);
      endMoveRows();
    }
    if (!(rows_[target] == wanted[target])) {
      rows_[target] = wanted[target];
      const QModelIndex changed = index(target);
      Q_EMIT dataChanged(changed, changed);
    }
  }
}

int ConversationListModel::row_of(qint64 conversation_id) const {
  for (int i = 0; i < rows_.size(); ++i)
    if (rows_[i].record.id == conversation_id) return i;
  return -1;
}

std::optional<ConversationRecord> ConversationListModel::record(qint64 conversation_id) const {
  for (const ConversationRecord& conversation : conversations_)
    if (conversation.id == conversation_id) return conversation;
  return std::nullopt;
}

qint64 ConversationListModel::conversation_at(int row) const {
  return row >= 0 && row < rows_.size() ? rows_[row].record.id : 0;
}

}  // namespace kvchat::ui
