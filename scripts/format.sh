#!/usr/bin/env bash
# Formats the project's C++ sources with .clang-format (clang-format 14, Debian's), or with --check
# only reports the files that differ and fails if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$clang_format" ]; then
  echo "format: clang-format-14 is not installed (make deps installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.cpp' '*.h')
else
  mapfile -t files < <(find app engine ui tests bench -name '*.cpp' -o -name '*.h' 2>/dev/null | sort)
fi
if [ "${1:-}" = "--check" ]; then
  differing=()
  for file in "${files[@]}"; do
    if ! "$clang_format" --dry-run --Werror "$file" >/dev/null 2>&1; then differing+=("$file"); fi
  done
  if [ ${#differing[@]} -gt 0 ]; then
    echo "format: ${#differing[@]} file(s) differ from .clang-format (run make format):" >&2
    printf '  %s\n' "${differing[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files match .clang-format"
else
  "$clang_format" -i "${files[@]}"
fi
