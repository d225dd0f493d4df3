"""The manual's reference pages, made from the code so that they cannot drift from it: every
command and option (the argument parser), the Python API (its docstrings and signatures), the
machine and workload schemas (their JSON Schema), the machines' queues and limits (the
profiles), and the exit codes and error kinds (the definitions the commands and jobs use).

    python -m mmm_orch.reference docs/reference           # write them
    python -m mmm_orch.reference docs/reference --check   # exit 1, naming each page out of date

scripts/test.sh runs the check before it builds the site, and so does a test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# page -> the module whose markdown() makes it (imported on use: the CLI never loads these)
PAGES = {
    "cli.md": "mmm_orch.reference.cli",
    "python.md": "mmm_orch.reference.python_api",
    "schemas.md": "mmm_orch.reference.schemas",
    "machine-table.md": "mmm_orch.reference.machine_table",
    "exit-codes.md": "mmm_orch.reference.exit_codes",
}
COMMAND = "python -m mmm_orch.reference docs/reference"


def header(title: str, source: str, intro: str = "") -> str:
    """A generated page's first lines: its title, where it comes from, and what it holds."""
    said = f"# {title}\n\nGenerated from {source} by `{COMMAND}`; a test fails when it is out of "
    said += "date with the code.\n"
    return said + (f"\n{intro.strip()}\n" if intro.strip() else "")


def cell(text: str | None) -> str:
    """Text as one line of a markdown table's cell."""
    return " ".join((text or "").split()).replace("|", "\\|")


def maker(page: str) -> Callable[[], str]:
    return importlib.import_module(PAGES[page]).markdown
