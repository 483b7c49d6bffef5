#pragma once
// A chat's own generation settings, and the named presets they are chosen from. A chat without its own
// settings follows the global ones (ChatSettings); one with them keeps a copy of the values (and the name of
// the preset they came from), so changing or deleting a preset later leaves the chats that used it as they were.
#include <QJsonObject>
#include <QList>
#include <QSettings>
#include <QString>
#include <QStringList>

#include <string>
#include <vector>

#include "app/settings.h"

namespace kvchat::app {

struct GenerationPreset {
  QString name;              // the preset's name; for a chat, the preset its values came from ("" = chosen by hand)
  double temperature = 0.7;  // 0 = greedy
  double top_p = 0.95;
  int top_k = 40;
  double min_p = 0.05;
  int max_new_tokens = 0;  // 0 = the global setting
  // The reply ends before the first occurrence of any of them; that text is neither shown nor kept.
  QStringList stop_texts;

  // The sampling values of `settings` (max tokens left to the global setting, no stop texts).
  static GenerationPreset from_settings(const ChatSettings& settings, const QString& name = QString());
  // Sampling and (when set) max tokens replaced by this preset's.
  void apply_to(ChatSettings& settings) const;
  std::vector<std::string> stop_strings() const;  // UTF-8, empty ones left out
  // {"preset", "temperature", "top_p", "top_k", "min_p", "max_new_tokens", "stop"}
  QJsonObject to_json() const;
  // Throws std::invalid_argument naming the key: a missing or wrong-typed value, or one out of the range the
  // settings dialog allows (temperature 0-5, top-p and min-p 0-1, top-k >= 0, max tokens >= 0).
  static GenerationPreset from_json(const QJsonObject& json);
  bool same_values(const GenerationPreset& other) const;  // everything but the name
};

// "Precise" (greedy), "Balanced" (the default settings' sampling) and "Creative", in that order.
QList<GenerationPreset> built_in_presets();
// The presets the user saved (QSettings "generation/presets", a JSON array), in the order saved. An entry that
// cannot be read is skipped (logged); the others are kept.
QList<GenerationPreset> load_user_presets(QSettings& settings);
void save_user_presets(QSettings& settings, const QList<GenerationPreset>& presets);

}  // namespace kvchat::app
