"""The manual as the tests read it: a page's code blocks, to run or compare as written
(test_manual_examples, and the pages that walk through adding a model or a scheduler)."""

from __future__ import annotations

from pathlib import Path


def blocks(page: Path, comments: bool = False) -> list[list[str]]:
    """The page's code blocks (indented by four spaces), each a list of its lines, without
    their comments unless `comments`."""
    found: list[list[str]] = []
    previous = ""
    for line in page.read_text().splitlines():
        if line.startswith("    ") and line.strip():
            if not previous.startswith("    "):
                found.append([])
            found[-1].append(line[4:] if comments else line.strip().split("  #")[0].strip())
        previous = line if line.strip() else previous if previous.startswith("    ") else line
    return found
