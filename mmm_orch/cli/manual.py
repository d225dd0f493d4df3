"""Where each command is explained in the manual (docs/): named at the end of its --help, and
linked from its entry in the command-line reference (reference/cli.py), one map for both."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

# A command (its first word) -> its page under docs/, with the section where it has one.
PAGES = {
    "machines": "reference/machine-table.md",
    "workloads": "reference/machines.md#workloads",
    "show": "reference/machines.md",
    "schema": "reference/schemas.md",
    "render": "concepts/scripts.md",
    "submit": "guides/jobs.md",
    "rerun": "guides/jobs.md",
    "status": "guides/jobs.md",
    "logs": "guides/jobs.md",
    "cancel": "guides/jobs.md",
    "backlog": "guides/backlog.md",
    "allocate": "guides/held-allocations.md",
    "hold": "guides/held-allocations.md",
    "launch": "guides/allocation.md",
    "sweep": "guides/studies.md",
    "pack-run": "guides/packing.md",
    "report": "guides/studies.md",
    "plot": "guides/studies.md",
    "usage": "guides/costs.md",
    "balance": "guides/costs.md",
    "diagnose": "guides/failures.md",
    "timeline": "guides/failures.md",
    "startup": "guides/failures.md",
    "profile": "guides/profiling.md",
    "export": "guides/pretrained.md#handing-a-model-on",
    "env": "getting-started.md#first-time-on-a-facility",
    "nodes": "guides/node-failures.md",
    "db": "guides/jobs.md#when-the-job-database-breaks",
}


def commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(full command name, its parser, its one-line help), depth first, in the order they were
    added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                full = f"{prefix} {name}".strip()
                yield full, sub, helps.get(name, "")
                yield from commands(sub, full)


def anchor(command: str) -> str:
    """The command's section in docs/reference/cli.md, as the site names headings."""
    return command.replace(" ", "-")


def link_pages(parser: argparse.ArgumentParser) -> None:
    """End each command's --help with its page in the manual and its every-option entry."""
    for name, sub, _ in commands(parser):
        sub.epilog = (
            f"The manual: docs/{PAGES[name.split()[0]]}; every option: "
            f"docs/reference/cli.md#{anchor(name)}."
        )
