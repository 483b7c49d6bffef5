#include "app/store/markdown_text.h"

#include <QRegularExpression>
#include <QStringList>

namespace kvchat::app {

namespace {

struct Fence {
  QChar character;
  int length = 0;
  QString info;
};

// A fence line: up to 3 spaces, then 3+ backticks or tildes; a backtick fence's info may hold no backtick.
bool parse_opening_fence(const QString& line, Fence* fence) {
  static const QRegularExpression pattern(QStringLiteral("^ {0,3}(`{3,}|~{3,})\\s*(.*)$"));
  const QRegularExpressionMatch match = pattern.match(line);
  if (!match.hasMatch()) return false;
  const QString marks = match.captured(1);
  const QString info = match.captured(2).trimmed();
  if (marks.front() == QLatin1Char('`') && info.contains(QLatin1Char('`'))) return false;
  fence->character = marks.front();
  fence->length = static_cast<int>(marks.size());
  fence->info = info.section(QLatin1Char(' '), 0, 0);
  return true;
}

int leading_spaces(const QString& line) {
  int count = 0;
  while (count < line.size() && line[count] == QLatin1Char(' ')) ++count;
  return count;
}

bool is_closing_fence(const QString& line, const Fence& fence) {
  if (leading_spaces(line) > 3) return false;
  const QString trimmed = line.trimmed();
  if (trimmed.size() < fence.length) return false;
  for (const QChar c : trimmed)
    if (c != fence.character) return false;
  return true;
}

}  // namespace

ThinkingSplit split_thinking(const QString& reply) {
  static const QString open = QStringLiteral("<think>"), close = QStringLiteral("</think>");
  ThinkingSplit split;
  qsizetype start = 0;
  while (start < reply.size() && reply.at(start).isSpace()) ++start;
  if (reply.mid(start, open.size()) != open) {
    split.answer = reply;
    return split;
  }
  split.has_thinking = true;
  const qsizetype body = start + open.size();
  const qsizetype end = reply.indexOf(close, body);
  split.closed = end >= 0;
  split.thinking = reply.mid(body, split.closed ? end - body : -1).trimmed();
  if (split.closed) {
    qsizetype after = end + close.size();
    while (after < reply.size() && reply.at(after).isSpace()) ++after;
    split.answer = reply.mid(after);
  }
  return split;
}

QList<MessageSegment> split_message_segments(const QString& markdown) {
  QList<MessageSegment> segments;
  QStringList prose;
  auto flush_prose = [&] {
    const QString text = prose.join(QLatin1Char('\n'));
    if (!text.trimmed().isEmpty()) segments.push_back({MessageSegment::Kind::Prose, text, QString()});
    prose.clear();
  };
  const QStringList lines = markdown.split(QLatin1Char('\n'));
  for (int i = 0; i < lines.size(); ++i) {
    Fence fence;
    if (!parse_opening_fence(lines[i], &fence)) {
      prose << lines[i];
      continue;
    }
    flush_prose();
    QStringList code;
    int j = i + 1;
    while (j < lines.size() && !is_closing_fence(lines[j], fence)) code << lines[j++];
    segments.push_back({MessageSegment::Kind::Code, code.join(QLatin1Char('\n')), fence.info});
    i = j;  // the closing fence (or past the end)
  }
  flush_prose();
  return segments;
}

namespace {

// Ends `lines[i]` with a hard break when it and the next line are both text of one paragraph.
void break_hard_before_next(QStringList& lines, int i) {
  QString& line = lines[i];
  if (line.trimmed().isEmpty() || lines[i + 1].trimmed().isEmpty()) return;             // a paragraph break
  if (line.endsWith(QStringLiteral("  ")) || line.endsWith(QLatin1Char('\\'))) return;  // already hard
  line += QStringLiteral("  ");
}

}  // namespace

QString with_hard_line_breaks(const QString& prose) {
  QStringList lines = prose.split(QLatin1Char('\n'));
  for (int i = 0; i + 1 < lines.size(); ++i) break_hard_before_next(lines, i);
  return lines.join(QLatin1Char('\n'));
}

QString markdown_with_hard_line_breaks(const QString& markdown) {
  QStringList lines = markdown.split(QLatin1Char('\n'));
  // Walks the lines as split_message_segments does: a prose line followed by another prose line gets the
  // break; fences and the lines between them are code, left alone.
  for (int i = 0; i < lines.size(); ++i) {
    Fence fence;
    if (parse_opening_fence(lines[i], &fence)) {
      int j = i + 1;
      while (j < lines.size() && !is_closing_fence(lines[j], fence)) ++j;
      i = j;  // the closing fence (or past the end)
      continue;
    }
    Fence next;
    if (i + 1 < lines.size() && !parse_opening_fence(lines[i + 1], &next)) break_hard_before_next(lines, i);
  }
  return lines.join(QLatin1Char('\n'));
}

}  // namespace kvchat::app
