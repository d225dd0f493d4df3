"""Terminal output: tables, JSON, and highlighted scripts. rich (and PyYAML) are imported in the
functions that print: their import would slow every command's start."""

from __future__ import annotations

import json
import sys
from typing import Any


def _console():
    from rich.console import Console

    return Console()


def print_rows(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    columns = [c for c in rows[0] if c not in ("queues", "description")] if rows else []
    for column in columns:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    _console().print(table)


def print_model(data: Any, as_json: bool) -> None:
    """A profile or spec (as usecases.machines.show dumps it): JSON, or YAML (highlighted on a
    terminal)."""
    if as_json:
        print(json.dumps(data, indent=2))
        return
    import yaml  # PyYAML's import costs start-up; only `show` needs it

    text = yaml.safe_dump(data, sort_keys=False, width=100)
    if sys.stdout.isatty():
        from rich.syntax import Syntax

        _console().print(Syntax(text, "yaml", background_color="default"))
    else:
        sys.stdout.write(text)


def print_script(script: str) -> None:
    from rich.syntax import Syntax

    _console().print(Syntax(script, "bash", background_color="default", word_wrap=False))
