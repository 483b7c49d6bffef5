#include "ui/decode_chart_panel.h"

#include <spdlog/spdlog.h>

#include <QChart>
#include <QChartView>
#include <QEvent>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QLabel>
#include <QLegend>
#include <QLineSeries>
#include <QPen>
#include <QPushButton>
#include <QScatterSeries>
#include <QVBoxLayout>
#include <QValueAxis>

#include <algorithm>
#include <initializer_list>
#include <numeric>

namespace kvchat::ui {

namespace {

QString cache_words(kvchat::KvCacheMode mode) {
  return mode == kvchat::KvCacheMode::Off ? QObject::tr("cache off") : QObject::tr("cache on");
}

// Below this panel height the chart's own title (the dock's title says the same) and the legend's row under
// the plot give their room to the plot and the axis titles.
constexpr int kCompactPanelHeight = 300;

QString chart_title() { return QObject::tr("Decode time per token"); }

double mean(const QList<double>& values) {
  return values.isEmpty() ? 0.0 : std::accumulate(values.begin(), values.end(), 0.0) / values.size();
}

}  // namespace

DecodeChartPanel::DecodeChartPanel(QWidget* parent) : QWidget(parent) {
  setObjectName("decodeChartPanel");
  chart_ = new QChart;
  chart_->setTitle(chart_title());
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chart_->setMargins(QMargins(4, 4, 4, 4));
  last_ = new QLineSeries(chart_);
  previous_ = new QLineSeries(chart_);
  previous_->setOpacity(0.6);
  proposals_ = new QScatterSeries(chart_);
  proposals_->setName(tr("accepted proposals (last reply)"));
  proposals_->setMarkerSize(6.0);
  chart_->addSeries(previous_);
  chart_->addSeries(last_);
  chart_->addSeries(proposals_);
  x_axis_ = new QValueAxis(chart_);
  // Short enough to be drawn whole in a chart beside the chat.
  x_axis_->setTitleText(tr("tokens attended over"));
  x_axis_->setLabelFormat("%d");
  y_axis_ = new QValueAxis(chart_);
  y_axis_->setTitleText(tr("ms per token"));
  chart_->addAxis(x_axis_, Qt::AlignBottom);
  chart_->addAxis(y_axis_, Qt::AlignLeft);
  for (QXYSeries* series : std::initializer_list<QXYSeries*>{last_, previous_, proposals_}) {
    series->attachAxis(x_axis_);
    series->attachAxis(y_axis_);
  }
  view_ = new QChartView(chart_, this);
  view_->setRenderHint(QPainter::Antialiasing);
  view_->setMinimumHeight(110);

  summary_ = new QLabel(this);
  summary_->setObjectName("decodeChartSummary");
  summary_->setWordWrap(true);
  summary_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  auto* save = new QPushButton(tr("Save PNG\u2026"), this);
  save->setObjectName("saveChartButton");
  connect(save, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getSaveFileName(this, tr("Save chart"), QStringLiteral("decode-time.png"),
                                                      tr("PNG images (*.png)"));
    if (!path.isEmpty()) savePng(path.endsWith(QLatin1String(".png"), Qt::CaseInsensitive) ? path : path + ".png");
  });
  auto* footer = new QHBoxLayout;
  footer->addWidget(summary_, 1);
  footer->addWidget(save);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(view_, 1);
  layout->addLayout(footer);
  setTimings(std::nullopt, std::nullopt);
  follow_palette();
}

void DecodeChartPanel::changeEvent(QEvent* event) {
  QWidget::changeEvent(event);
  if (event->type() == QEvent::PaletteChange) follow_palette();
}

void DecodeChartPanel::follow_palette() {
  // The chart's theme has its own fixed colours: its background and text take the window's palette
  // instead, so that a dark appearance gets a dark chart with light text.
  const QPalette colours = palette();
  const QColor text = colours.color(QPalette::Text), lines = colours.color(QPalette::Mid);
  chart_->setBackgroundBrush(colours.brush(QPalette::Base));
  chart_->setBackgroundPen(QPen(lines));
  chart_->setTitleBrush(text);
  chart_->legend()->setLabelColor(text);
  for (QValueAxis* axis : {x_axis_, y_axis_}) {
    axis->setLabelsColor(text);
    axis->setTitleBrush(text);
    axis->setLinePenColor(lines);
    axis->setGridLineColor(colours.color(QPalette::Midlight));
  }
  view_->setBackgroundBrush(colours.brush(QPalette::Base));
}

void DecodeChartPanel::fill(QLineSeries* series, const std::optional<kvchat::app::DecodeTimings>& timings,
                            const QString& role) {
  QList<QPointF> points;
  if (timings) {
    points.reserve(timings->step_ms.size());
    for (int i = 0; i < timings->step_ms.size(); ++i)
      points.append(QPointF(timings->first_position + i, timings->step_ms[i]));
    series->setName(QStringLiteral("%1 (%2)").arg(role, cache_words(timings->cache_mode)));
  } else {
    series->setName(role);
  }
  series->replace(points);
}

void DecodeChartPanel::setTimings(const std::optional<kvchat::app::DecodeTimings>& last,
                                  const std::optional<kvchat::app::DecodeTimings>& previous) {
  fill(last_, last, tr("last reply"));
  fill(previous_, previous, tr("reply before"));
  // Speculative decoding: the last reply's tokens sampled from rows an earlier pass fed ahead, marked.
  QList<QPointF> accepted;
  if (last)
    for (int i = 0; i < last->step_ms.size() && i < last->from_proposal.size(); ++i)
      if (last->from_proposal[i]) accepted.append(QPointF(last->first_position + i, last->step_ms[i]));
  proposals_->replace(accepted);
  proposals_->setVisible(!accepted.isEmpty());
  double max_x = 1, max_y = 0.001, min_x = -1;
  for (QLineSeries* series : {last_, previous_})
    for (const QPointF& point : series->points()) {
      min_x = min_x < 0 ? point.x() : std::min(min_x, point.x());
      max_x = std::max(max_x, point.x());
      max_y = std::max(max_y, point.y());
    }
  x_axis_->setRange(std::max(0.0, min_x), max_x);
  y_axis_->setRange(0.0, max_y * 1.1);
  QStringList lines;
  if (last)
    lines << tr("Last reply: %1 steps, %2 ms each on average (%3).")
                 .arg(last->step_ms.size())
                 .arg(mean(last->step_ms), 0, 'f', 3)
                 .arg(cache_words(last->cache_mode));
  if (!accepted.isEmpty())
    lines << tr("%1 of its tokens came with an earlier pass (speculative decoding: accepted proposals).")
                 .arg(accepted.size());
  if (previous)
    lines << tr("Reply before: %1 steps, %2 ms on average (%3).")
                 .arg(previous->step_ms.size())
                 .arg(mean(previous->step_ms), 0, 'f', 3)
                 .arg(cache_words(previous->cache_mode));
  if (lines.isEmpty()) lines << tr("No reply yet: the chart fills in as the model writes.");
  summary_->setText(lines.join(QLatin1Char(' ')));
}

void DecodeChartPanel::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  const bool compact = height() < kCompactPanelHeight;
  if (compact == compact_) return;
  compact_ = compact;
  chart_->setTitle(compact ? QString() : chart_title());
  chart_->legend()->setAlignment(compact ? Qt::AlignRight : Qt::AlignBottom);
}

bool DecodeChartPanel::savePng(const QString& path) {
  const bool saved = view_->grab().save(path, "PNG");
  if (saved)
    spdlog::info("decode-time chart saved to {}", path.toStdString());
  else
    spdlog::error("cannot save the decode-time chart to {}", path.toStdString());
  return saved;
}

}  // namespace kvchat::ui
