#!/usr/bin/env bash
# Takes the README's screenshots of the desktop app into docs/screenshots/ with the window's own --screenshot
# mode (QWidget::grab). Uses $DISPLAY when there is one (e.g. Xvfb :99), else Qt's offscreen platform.
#   scripts/readme-screenshots.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=docs/screenshots
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "${DISPLAY:-}" ]; then export QT_QPA_PLATFORM=offscreen; fi
app="$build/kvchat"

# 1. Markdown and a code block. stories260K only writes children's stories, so this conversation's reply is
#    written into the database for the picture (model "example"); the window renders it as it would any reply.
"$build/kvchat-cli" chat --model resources/models/stories260K --db "$work/markdown.sqlite3" --conversation new \
  --message "Once upon a time" --max-new-tokens 60 --temperature 0 >/dev/null 2>&1
sqlite3 "$work/markdown.sqlite3" <<'SQL'
INSERT INTO messages (conversation_id, role, text, created_at, model, stats)
VALUES (1, 'user', 'How do I read a file line by line in C++? Keep it short.', 1700000000000, '', '{}');
INSERT INTO messages (conversation_id, role, text, created_at, model, stats)
VALUES (1, 'assistant', 'Use **std::getline** on an `std::ifstream`:

```cpp
#include <fstream>
#include <iostream>
#include <string>

int main() {
  std::ifstream in("notes.txt");
  for (std::string line; std::getline(in, line);)
    std::cout << line << ''\n'';
}
```

- it stops at the end of the file,
- a missing file just reads nothing: check `in.is_open()` first.

A single line break
stays a line break.', 1700000001000, 'example', '{}');
SQL
"$app" --db "$work/markdown.sqlite3" --settings "$work/markdown.ini" --window-size 1100x760 \
  --screenshot "$out/markdown-and-code.png"

# 2. The decode-time chart after one cached and one uncached reply (same chat, the cache switched off between).
#    Replies of at most 80 tokens, greedy, so that the uncached one climbs over a visible stretch of positions.
printf '[chat]\nmax_new_tokens=80\ntemperature=0\n' > "$work/chart.ini"
"$app" --db "$work/chart.sqlite3" --settings "$work/chart.ini" --window-size 1240x760 --chart --then-cache-off \
  --send "Once upon a time" --send "Lily went to the park" --screenshot "$out/decode-time-chart.png"

# 3. The window at 800x500.
"$app" --db "$work/small.sqlite3" --settings "$work/small.ini" --window-size 800x500 \
  --send "Once upon a time" --send "Tom saw a big dog" --screenshot "$out/window-800x500.png"
ls -l "$out"
