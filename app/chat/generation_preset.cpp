#include "app/chat/generation_preset.h"

#include <spdlog/spdlog.h>

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonValue>

#include <stdexcept>

namespace kvchat::app {

namespace {

const QString kPresetsKey = QStringLiteral("generation/presets");

double number_in(const QJsonObject& json, const char* key, double low, double high) {
  const QJsonValue value = json.value(QLatin1String(key));
  if (!value.isDouble()) throw std::invalid_argument(std::string("generation settings: '") + key + "' is not a number");
  const double number = value.toDouble();
  if (!(number >= low && number <= high))
    throw std::invalid_argument(std::string("generation settings: '") + key + "' = " + std::to_string(number) +
                                " is out of range (" + std::to_string(low) + " to " + std::to_string(high) + ")");
  return number;
}

}  // namespace

GenerationPreset GenerationPreset::from_settings(const ChatSettings& settings, const QString& name) {
  GenerationPreset preset;
  preset.name = name;
  preset.temperature = settings.temperature;
  preset.top_p = settings.top_p;
  preset.top_k = settings.top_k;
  preset.min_p = settings.min_p;
  return preset;
}

void GenerationPreset::apply_to(ChatSettings& settings) const {
  settings.temperature = temperature;
  settings.top_p = top_p;
  settings.top_k = top_k;
  settings.min_p = min_p;
  if (max_new_tokens > 0) settings.max_new_tokens = max_new_tokens;
}

std::vector<std::string> GenerationPreset::stop_strings() const {
  std::vector<std::string> stops;
  for (const QString& text : stop_texts)
    if (!text.isEmpty()) stops.push_back(text.toStdString());
  return stops;
}

QJsonObject GenerationPreset::to_json() const {
  QJsonObject json;
  json.insert(QStringLiteral("preset"), name);
  json.insert(QStringLiteral("temperature"), temperature);
  json.insert(QStringLiteral("top_p"), top_p);
  json.insert(QStringLiteral("top_k"), top_k);
  json.insert(QStringLiteral("min_p"), min_p);
  json.insert(QStringLiteral("max_new_tokens"), max_new_tokens);
  json.insert(QStringLiteral("stop"), QJsonArray::fromStringList(stop_texts));
  return json;
}

GenerationPreset GenerationPreset::from_json(const QJsonObject& json) {
  GenerationPreset preset;
  const QJsonValue name = json.value(QStringLiteral("preset"));
  if (!name.isUndefined() && !name.isString())
    throw std::invalid_argument("generation settings: 'preset' is not a text");
  preset.name = name.toString();
  preset.temperature = number_in(json, "temperature", 0.0, 5.0);
  preset.top_p = number_in(json, "top_p", 0.0, 1.0);
  preset.top_k = static_cast<int>(number_in(json, "top_k", 0, 1 << 20));
  preset.min_p = number_in(json, "min_p", 0.0, 1.0);
  preset.max_new_tokens = static_cast<int>(number_in(json, "max_new_tokens", 0, 1 << 20));
  const QJsonValue stop = json.value(QStringLiteral("stop"));
  if (!stop.isUndefined()) {
    if (!stop.isArray()) throw std::invalid_argument("generation settings: 'stop' is not a list");
    for (const QJsonValue& text : stop.toArray()) {
      if (!text.isString()) throw std::invalid_argument("generation settings: an entry of 'stop' is not a text");
      preset.stop_texts << text.toString();
    }
  }
  return preset;
}

bool GenerationPreset::same_values(const GenerationPreset& other) const {
  return temperature == other.temperature && top_p == other.top_p && top_k == other.top_k && min_p == other.min_p &&
         max_new_tokens == other.max_new_tokens && stop_texts == other.stop_texts;
}

QList<GenerationPreset> built_in_presets() {
  GenerationPreset precise;
  precise.name = QStringLiteral("Precise");
  precise.temperature = 0.0;  // greedy: the same reply every time
  precise.top_p = 1.0;
  precise.top_k = 0;
  precise.min_p = 0.0;
  GenerationPreset balanced = GenerationPreset::from_settings(ChatSettings{}, QStringLiteral("Balanced"));
  GenerationPreset creative;
  creative.name = QStringLiteral("Creative");
  creative.temperature = 1.1;
  creative.top_p = 0.98;
  creative.top_k = 100;
  creative.min_p = 0.02;
  return {precise, balanced, creative};
}

QList<GenerationPreset> load_user_presets(QSettings& settings) {
  const QString text = settings.value(kPresetsKey).toString();
  if (text.isEmpty()) return {};
  QJsonParseError error{};
  const QJsonDocument document = QJsonDocument::fromJson(text.toUtf8(), &error);
  if (error.error != QJsonParseError::NoError || !document.isArray()) {
    spdlog::warn("settings {}: {} is not a JSON list ({}); no saved presets", settings.fileName().toStdString(),
                 kPresetsKey.toStdString(), error.errorString().toStdString());
    return {};
  }
  QList<GenerationPreset> presets;
  for (const QJsonValue& entry : document.array()) {
    try {
      if (!entry.isObject()) throw std::invalid_argument("a preset is not a JSON object");
      GenerationPreset preset = GenerationPreset::from_json(entry.toObject());
      if (preset.name.trimmed().isEmpty()) throw std::invalid_argument("a preset has no name");
      presets.append(preset);
    } catch (const std::invalid_argument& bad) {
      spdlog::warn("settings {}: {}: {}; that preset is skipped", settings.fileName().toStdString(),
                   kPresetsKey.toStdString(), bad.what());
    }
  }
  return presets;
}

void save_user_presets(QSettings& settings, const QList<GenerationPreset>& presets) {
  QJsonArray array;
  for (const GenerationPreset& preset : presets) array.append(preset.to_json());
  settings.setValue(kPresetsKey, QString::fromUtf8(QJsonDocument(array).toJson(QJsonDocument::Compact)));
  settings.sync();
}

}  // namespace kvchat::app
