#pragma once
// Message text as Markdown: splitting it into prose and fenced code blocks, and the line breaks a reader
// sees. One set of rules for the window (which renders the prose with QTextDocument's Markdown reader) and
// the Markdown export (which must read the same in any viewer).
#include <QList>
#include <QString>

namespace kvchat::app {

struct MessageSegment {
  enum class Kind { Prose, Code };
  Kind kind = Kind::Prose;
  QString text;      // prose: Markdown source; code: the block's lines, without the fences
  QString language;  // code: the fence's info word ("cpp"), may be empty
  bool operator==(const MessageSegment& other) const {
    return kind == other.kind && text == other.text && language == other.language;
  }
};

// A reasoning model's reply (Qwen3, DeepSeek-R1 and the like) opens with its thinking between <think> and
// </think>. The window shows that part folded; the chat template decides what of it later prompts keep.
struct ThinkingSplit {
  bool has_thinking = false;  // the reply opens with <think> (after any whitespace)
  bool closed = false;        // and </think> has come (a reply still streaming may not have it yet)
  QString thinking;           // between the tags, trimmed
  QString answer;             // after </think>, leading whitespace dropped; the whole text without thinking
};
ThinkingSplit split_thinking(const QString& reply);

// Fenced blocks (``` or ~~~, up to three spaces of indent; closed by a fence of the same character at least
// as long). A block not closed yet (a reply still streaming) runs to the end. Empty prose is left out.
QList<MessageSegment> split_message_segments(const QString& markdown);

// Model text breaks lines where it means them: every single line break inside prose becomes a Markdown hard
// break (two trailing spaces), so paragraphs do not run together. Blank lines stay paragraph breaks.
QString with_hard_line_breaks(const QString& prose);

// The same for a whole message: the prose between fenced code blocks gets its hard breaks, the blocks and
// their fences are left exactly as written.
QString markdown_with_hard_line_breaks(const QString& markdown);

}  // namespace kvchat::app
