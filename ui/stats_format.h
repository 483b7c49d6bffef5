#pragma once
// Human-readable figures for the window: byte sizes, token speeds, one reply's stats line.
#include <QJsonObject>
#include <QString>

#include "app/chat/engine_worker.h"
#include "engine/types.h"

namespace kvchat::ui {

QString format_bytes(qint64 bytes);             // "812 B", "12.5 KiB", "3.2 MiB", "1.1 GiB"
QString format_rate(double tokens_per_second);  // "123.4 tok/s"
// The live speed: "decoding 123.4 tok/s · 40 tok" while a reply streams, "decode …" once it ended.
QString format_live_speed(bool decoding, double tokens_per_second, int generated_tokens);
// "prefill 850 tok/s · TTFT 12 ms · decode 310 tok/s · 120 tokens · 40 reused / 12 prefilled · stopped"
QString format_reply_stats(const kvchat::GenerationStats& stats);
// The status bar's model line: "stories260K-Q8_0.gguf · llama · Q8_0 · 336 KiB" (name, architecture,
// quantization type, size on disk; the weights in memory when the size on disk is unknown).
QString format_model_summary(const kvchat::app::ModelInfo& info);
// The model label's tooltip: the path, then architecture, format, quantization type and both sizes, then
// parameters, layers, context and K/V bytes per token.
QString format_model_details(const kvchat::app::ModelInfo& info);
// The stats line for a stored message's stats JSON ("" when it has none; the error when it failed).
QString format_stored_stats(const QJsonObject& stats);

}  // namespace kvchat::ui
