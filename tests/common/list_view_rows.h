#pragma once
// A list view's rows, read through its model as a user would see them.
#include <QAbstractItemView>
#include <QString>

namespace kvchat::test {

inline QModelIndex list_row(const QAbstractItemView* view, int row) { return view->model()->index(row, 0); }
inline int list_count(const QAbstractItemView* view) { return view->model()->rowCount(); }
inline QString list_text(const QAbstractItemView* view, int row) { return list_row(view, row).data().toString(); }
inline int current_list_row(const QAbstractItemView* view) { return view->currentIndex().row(); }
// As a click on the row would: the view's current row changes and its selection with it.
inline void select_list_row(QAbstractItemView* view, int row) { view->setCurrentIndex(list_row(view, row)); }

}  // namespace kvchat::test
