#pragma once
// Splitting a message into prose and fenced code blocks, and the Markdown the prose is rendered from
// (app/store/markdown_text.h: the Markdown export follows the same rules). Code blocks get their own widget
// (monospace, a Copy button, scrolling sideways instead of widening the transcript); prose is rendered by
// QTextDocument's Markdown reader with raw HTML off.
#include "app/store/markdown_text.h"

namespace kvchat::ui {

using kvchat::app::MessageSegment;
using kvchat::app::split_message_segments;
using kvchat::app::with_hard_line_breaks;

}  // namespace kvchat::ui
