#pragma once
// The decode-time chart: how long each decode step of the last reply took against the position it attended
// over, and the reply before it as a second line. With the KV cache a step costs about the same at every
// position (a flat line, O(n) for the reply); without it every step recomputes the whole prefix, so the line
// climbs (O(n^2)). The times are the engine thread's own measurements (ChatController::lastDecodeTimings).
#include <QWidget>

#include <optional>

#include "app/chat/engine_worker.h"

class QChart;
class QChartView;
class QLabel;
class QLineSeries;
class QScatterSeries;
class QValueAxis;

namespace kvchat::ui {

class DecodeChartPanel : public QWidget {
  Q_OBJECT
 public:
  explicit DecodeChartPanel(QWidget* parent = nullptr);
  void setTimings(const std::optional<kvchat::app::DecodeTimings>& last,
                  const std::optional<kvchat::app::DecodeTimings>& previous);
  QLineSeries* lastSeries() const { return last_; }
  QLineSeries* previousSeries() const { return previous_; }
  QScatterSeries* proposalSeries() const { return proposals_; }
  QChart* chart() const { return chart_; }
  bool savePng(const QString& path);  // the chart as it is drawn; false (and logged) when it cannot be written

 protected:
  void changeEvent(QEvent* event) override;        // a new palette (View > Appearance) recolours the chart
  void resizeEvent(QResizeEvent* event) override;  // a short panel gives the chart's title and legend row to the plot

 private:
  void follow_palette();
  void fill(QLineSeries* series, const std::optional<kvchat::app::DecodeTimings>& timings, const QString& role);
  QChart* chart_ = nullptr;
  QChartView* view_ = nullptr;
  QLineSeries* last_ = nullptr;
  QLineSeries* previous_ = nullptr;
  QScatterSeries* proposals_ = nullptr;  // the last reply's tokens that came with a speculative pass
  QValueAxis* x_axis_ = nullptr;
  QValueAxis* y_axis_ = nullptr;
  QLabel* summary_ = nullptr;
  bool compact_ = false;
};

}  // namespace kvchat::ui
