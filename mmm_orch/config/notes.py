"""What a profile's or spec's fields mean, in the words of the comments beside them in the code:
the JSON Schema carries them as descriptions (editors show them; the manual's schema page is
made from it), so a field is explained in one place, next to its type."""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from typing import Any

SKIPPED = ("noqa", "type:", "pragma")  # tool directives, not words for a reader


def comments(cls: type) -> dict[str, str]:
    """Field name -> the comment lines just above its line, then the comment at its end."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):  # no source shipped: the fields go undescribed
        return {}
    source = inspect.cleandoc("\n" + "".join(lines)) if lines[0][:1].isspace() else "".join(lines)
    own_line: dict[int, str] = {}
    trailing: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if text.startswith(SKIPPED):
                continue
            is_alone = not token.line[: token.start[1]].strip()
            (own_line if is_alone else trailing)[token.start[0]] = text
    notes = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above: list[str] = []
            at = node.lineno - 1
            while at in own_line:
                above.insert(0, own_line[at])
                at -= 1
            last = node.end_lineno or node.lineno
            said = above + [t for n, t in trailing.items() if node.lineno <= n <= last]
            if said:
                notes[node.target.id] = " ".join(said)
    return notes


def describe(schema: dict[str, Any], classes: list[type]) -> dict[str, Any]:
    """`schema` with each field of `classes` that has no description given its comments'."""
    by_name = {cls.__name__: cls for cls in classes}
    parts = [(schema.get("title", ""), schema), *schema.get("$defs", {}).items()]
    for name, part in parts:
        notes = comments(by_name[name]) if name in by_name else {}
        for field, spec in part.get("properties", {}).items():
            if field in notes and "description" not in spec:
                spec["description"] = notes[field]
    return schema
