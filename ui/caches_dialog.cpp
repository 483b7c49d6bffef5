#include "ui/caches_dialog.h"

#include <QDialogButtonBox>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include "app/chat/chat_controller.h"
#include "ui/conversation_titles.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

CachesDialog::CachesDialog(kvchat::app::ChatController* controller, QWidget* parent)
    : QDialog(parent), controller_(controller) {
  setObjectName("cachesDialog");
  setWindowTitle(tr("Caches in memory"));
  table_ = new QTableWidget(0, 4, this);
  table_->setObjectName("cachesTable");
  table_->setHorizontalHeaderLabels({tr("Chat"), tr("Tokens"), tr("Memory"), QString()});
  table_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  table_->verticalHeader()->hide();
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  total_ = new QLabel(this);
  total_->setObjectName("cachesTotal");
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(table_, 1);
  layout->addWidget(total_);
  layout->addWidget(buttons);
  resize(520, 300);
  connect(controller_, &kvchat::app::ChatController::cacheGaugeChanged, this, &CachesDialog::refresh);
  connect(controller_, &kvchat::app::ChatController::conversationsChanged, this, &CachesDialog::refresh);
  refresh();
}

void CachesDialog::refresh() {
  const auto held = controller_->heldCaches();
  const QHash<qint64, QString> titles = distinguishable_titles(controller_->conversations());
  table_->setRowCount(static_cast<int>(held.size()));
  for (int row = 0; row < held.size(); ++row) {
    const auto& cache = held[row];
    const QString title = titles.value(cache.conversation_id, QString::number(cache.conversation_id));
    table_->setItem(row, 0, new QTableWidgetItem(title));
    table_->setItem(row, 1, new QTableWidgetItem(QString::number(cache.tokens)));
    table_->setItem(row, 2, new QTableWidgetItem(format_bytes(cache.bytes)));
    auto* clear = new QPushButton(tr("Clear"), table_);
    clear->setObjectName(QStringLiteral("clearCache_%1").arg(cache.conversation_id));
    clear->setToolTip(tr("Free this chat's cache; its next reply prefills the chat again"));
    const qint64 id = cache.conversation_id;
    connect(clear, &QPushButton::clicked, this, [this, id] { controller_->clearCache(id); });
    table_->setCellWidget(row, 3, clear);
  }
  const auto gauge = controller_->cacheGauge();
  QString text = tr("No chat holds a cache now.");
  if (held.size() == 1)
    text = tr("1 chat holds %1 of the %2 budget.");
  else if (held.size() > 1)
    text = tr("%1 chats hold %2 of the %3 budget.").arg(held.size());
  if (!held.isEmpty()) text = text.arg(format_bytes(gauge.total_bytes), format_bytes(gauge.budget_bytes));
  total_->setText(text);
}

}  // namespace kvchat::ui
