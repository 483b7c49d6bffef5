"""How the fixture generators write JSON: indented, with each list of numbers (token ids, factors) on one line."""
import json
import re

_NUMBER_LIST = re.compile(r"\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]")


def dumps(value):
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return _NUMBER_LIST.sub(lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text)


def write(path, value):
    with open(path, "w", encoding="utf-8") as out:
        out.write(dumps(value) + "\n")
