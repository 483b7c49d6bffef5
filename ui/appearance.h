#pragma once
// The window's colours: the system's palette, or a light or a dark one chosen in View > Appearance (saved
// in the settings). Colours that no palette role names (an error's red, a warning's amber) come in a
// light and a dark variant, picked by how dark the palette is.
#include <QColor>
#include <QPalette>
#include <QString>

#include <functional>

class QWidget;

namespace kvchat::ui {

enum class Appearance { System, Light, Dark };

Appearance appearance_from_name(const QString& name);  // "system", "light", "dark"; anything else: System
QString appearance_name(Appearance appearance);

QPalette dark_palette();
// Gives the application the appearance's palette. System is the palette the application had before the
// first call (the platform's).
void apply_appearance(Appearance appearance);

bool is_dark(const QPalette& palette);  // its window colour is darker than mid-grey
// Text colours for errors and warnings readable on the palette's window and base colours.
QColor error_text_colour(const QPalette& palette);
QColor warning_text_colour(const QPalette& palette);
QColor error_background_colour(const QPalette& palette);
QColor error_border_colour(const QPalette& palette);
QColor warning_border_colour(const QPalette& palette);
// The same, for the application's palette.
QColor error_text_colour();
QColor warning_text_colour();

// Gives `widget` the style sheet `make` builds from the application's palette, now and again each time that
// palette changes (View > Appearance), so that a colour no palette role names (a warning's amber, an error's
// red) follows a switch at once rather than at the next start. A later call replaces the earlier `make`.
void set_palette_style_sheet(QWidget* widget, std::function<QString(const QPalette&)> make);

}  // namespace kvchat::ui
