#pragma once
// The window's colours: the system's palette, or a light or a dark one chosen in View > Appearance (saved
// in the settings). Colours that no palette role names (an error's red, a warning's amber) come in a
// light and a dark variant, picked by how dark the palette is.
#include <QColor>
#include <QPalette>
#include <QString>

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

}  // namespace kvchat::ui
