#include "ui/appearance.h"

#include <spdlog/spdlog.h>

#include <QApplication>
#include <QEvent>
#include <QPointer>
#include <QSet>
#include <QStyle>
#include <QWidget>

#include <optional>

namespace kvchat::ui {

namespace {

// The palette before any appearance was applied: what "follow the system" returns to.
std::optional<QPalette>& system_palette() {
  static std::optional<QPalette> palette;
  return palette;
}

// Rebuilds its widget's style sheet from the palette. A child of the widget: it lives as long as it.
class PaletteStyleSheet : public QObject {
 public:
  PaletteStyleSheet(QWidget* widget, std::function<QString(const QPalette&)> make)
      : QObject(widget), widget_(widget), make_(std::move(make)) {
    setObjectName(QStringLiteral("paletteStyleSheet"));
    all().insert(this);
  }
  ~PaletteStyleSheet() override { all().remove(this); }
  void set_make(std::function<QString(const QPalette&)> make) { make_ = std::move(make); }
  void apply() {
    const QString sheet = make_(QApplication::palette());
    if (sheet != widget_->styleSheet()) widget_->setStyleSheet(sheet);
  }
  static QSet<PaletteStyleSheet*>& all() {
    static QSet<PaletteStyleSheet*> keepers;
    return keepers;
  }

 private:
  QWidget* widget_;
  std::function<QString(const QPalette&)> make_;
};

// A style sheet that names a colour gives its widget a palette of its own, so the application's new palette
// reaches neither it nor its children as an event: only the application hears of the change. One filter
// on the application passes it on to every kept style sheet.
class ApplicationPaletteWatcher : public QObject {
 public:
  static void install() {
    static QPointer<ApplicationPaletteWatcher> watcher;  // gone with its application
    if (watcher || !qApp) return;
    watcher = new ApplicationPaletteWatcher(qApp);
    qApp->installEventFilter(watcher);
  }

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override {
    if (watched == qApp && event->type() == QEvent::ApplicationPaletteChange)
      for (PaletteStyleSheet* keeper : PaletteStyleSheet::all().values()) keeper->apply();
    return false;
  }

 private:
  using QObject::QObject;
};

}  // namespace

void set_palette_style_sheet(QWidget* widget, std::function<QString(const QPalette&)> make) {
  auto* keeper = dynamic_cast<PaletteStyleSheet*>(
      widget->findChild<QObject*>(QStringLiteral("paletteStyleSheet"), Qt::FindDirectChildrenOnly));
  if (keeper)
    keeper->set_make(std::move(make));
  else
    keeper = new PaletteStyleSheet(widget, std::move(make));
  ApplicationPaletteWatcher::install();
  keeper->apply();
}

Appearance appearance_from_name(const QString& name) {
  if (name == QLatin1String("light")) return Appearance::Light;
  if (name == QLatin1String("dark")) return Appearance::Dark;
  if (name != QLatin1String("system") && !name.isEmpty())
    spdlog::warn("appearance '{}' is none of system, light, dark; following the system", name.toStdString());
  return Appearance::System;
}

QString appearance_name(Appearance appearance) {
  switch (appearance) {
    case Appearance::Light: return QStringLiteral("light");
    case Appearance::Dark: return QStringLiteral("dark");
    case Appearance::System: break;
  }
  return QStringLiteral("system");
}

QPalette dark_palette() {
  // Text on every background at a WCAG contrast of at least 4.5 (the secondary text, drawn in Mid, too).
  const QColor window(0x2b, 0x2b, 0x2b), base(0x1e, 0x1e, 0x1e), text(0xe8, 0xe8, 0xe8), dimmed(0x9e, 0x9e, 0x9e);
  QPalette palette(window);
  palette.setColor(QPalette::Window, window);
  palette.setColor(QPalette::WindowText, text);
  palette.setColor(QPalette::Base, base);
  palette.setColor(QPalette::AlternateBase, window);
  palette.setColor(QPalette::Text, text);
  palette.setColor(QPalette::Button, QColor(0x3a, 0x3a, 0x3a));
  palette.setColor(QPalette::ButtonText, text);
  palette.setColor(QPalette::BrightText, Qt::white);
  palette.setColor(QPalette::ToolTipBase, window);
  palette.setColor(QPalette::ToolTipText, text);
  palette.setColor(QPalette::PlaceholderText, dimmed);
  palette.setColor(QPalette::Light, QColor(0x55, 0x55, 0x55));
  palette.setColor(QPalette::Midlight, QColor(0x44, 0x44, 0x44));
  palette.setColor(QPalette::Mid, dimmed);  // also the secondary text's colour (style sheets' palette(mid))
  palette.setColor(QPalette::Dark, QColor(0x18, 0x18, 0x18));
  palette.setColor(QPalette::Shadow, Qt::black);
  palette.setColor(QPalette::Highlight, QColor(0x2f, 0x65, 0xca));
  palette.setColor(QPalette::HighlightedText, Qt::white);
  palette.setColor(QPalette::Link, QColor(0x8a, 0xb8, 0xff));
  palette.setColor(QPalette::LinkVisited, QColor(0xc8, 0xa8, 0xff));
  for (QPalette::ColorRole role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
    palette.setColor(QPalette::Disabled, role, QColor(0x80, 0x80, 0x80));
  return palette;
}

void apply_appearance(Appearance appearance) {
  if (!system_palette()) system_palette() = QApplication::palette();
  switch (appearance) {
    case Appearance::System: QApplication::setPalette(*system_palette()); break;
    case Appearance::Light: QApplication::setPalette(QApplication::style()->standardPalette()); break;
    case Appearance::Dark: QApplication::setPalette(dark_palette()); break;
  }
}

bool is_dark(const QPalette& palette) { return palette.color(QPalette::Window).lightness() < 128; }

QColor error_text_colour(const QPalette& palette) {
  return is_dark(palette) ? QColor(0xff, 0x8a, 0x80) : QColor(0xb0, 0x00, 0x20);
}
QColor warning_text_colour(const QPalette& palette) {
  return is_dark(palette) ? QColor(0xe6, 0xc4, 0x5c) : QColor(0x8a, 0x6d, 0x00);
}
QColor error_background_colour(const QPalette& palette) {
  return is_dark(palette) ? QColor(0x4a, 0x1c, 0x22) : QColor(0xfd, 0xec, 0xee);
}
QColor error_border_colour(const QPalette& palette) {
  return is_dark(palette) ? QColor(0x8a, 0x3a, 0x44) : QColor(0xf0, 0xb8, 0xc0);
}
QColor warning_border_colour(const QPalette& palette) {
  return is_dark(palette) ? QColor(0x9a, 0x80, 0x20) : QColor(0xc9, 0xa4, 0x00);
}
QColor error_text_colour() { return error_text_colour(QApplication::palette()); }
QColor warning_text_colour() { return warning_text_colour(QApplication::palette()); }

}  // namespace kvchat::ui
