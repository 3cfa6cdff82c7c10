"""Writing a derived config (tuned, distilled) as the input's own text with a few fields of its
`speculation:` section changed, so the user's comments and layout survive (a YAML round trip
through a parser would drop them)."""

from __future__ import annotations

import re


def with_speculation(source: str, values: dict[str, str | None], comments: list[str]) -> str:
    """`source` with each `speculation.<key>: <value>` of `values` set (None: removed), the set
    fields last in the section with `comments` above them."""
    lines = source.splitlines()
    try:
        at = next(i for i, line in enumerate(lines) if re.match(r"speculation:\s*(#.*)?$", line))
    except StopIteration:
        raise ValueError("the config has no block-style `speculation:` section") from None
    end = at + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "#"))):
        end += 1
    keys = "|".join(map(re.escape, values))
    body = [line for line in lines[at + 1:end] if not re.match(rf"\s+({keys}):", line)]
    block = [f"  # {c}" if c else "  #" for c in comments]
    block += [f"  {key}: {value}" for key, value in values.items() if value is not None]
    return "\n".join(lines[:at + 1] + body + block + lines[end:]) + "\n"
