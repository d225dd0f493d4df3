"""The command-line reference (docs/reference/cli.md), made from the argument parser itself so
that it cannot drift from it: every command, its usage, its options and their help.

    python -m mmm_orch.cli.reference docs/reference/cli.md           # write it
    python -m mmm_orch.cli.reference docs/reference/cli.md --check   # exit 1 if out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HEADER = """\
# Command-line reference

Generated from mmm-orch's argument parser by `python -m mmm_orch.cli.reference
docs/reference/cli.md`; a test fails when it is out of date. `mmm-orch COMMAND --help` says the
same.
"""


def markdown(parser: argparse.ArgumentParser) -> str:
    """The page: the global options, then each command (and sub-command) in the parser's order."""
    sections = [HEADER, _section(parser, "mmm-orch", "")]
    sections += [_section(sub, name, said) for name, sub, said in _commands(parser, "")]
    return "\n".join(sections).rstrip() + "\n"


def _commands(parser: argparse.ArgumentParser, prefix: str):
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
                yield from _commands(sub, full)


def _section(parser: argparse.ArgumentParser, name: str, said: str) -> str:
    lines = [f"## `{name}`", ""]
    for text in (said, parser.description):
        if text and " ".join(text.split()) not in lines:
            lines += [" ".join(text.split()), ""]
    usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
    lines += ["```", usage, "```", ""]
    rows = [_row(action) for action in parser._actions if _shown(action)]
    if rows:
        lines += ["| argument | help |", "|---|---|", *rows, ""]
    return "\n".join(lines)


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS and not isinstance(
        action, argparse._HelpAction | argparse._SubParsersAction
    )


def _row(action: argparse.Action) -> str:
    if action.option_strings:
        takes = action.nargs != 0
        metavar = action.metavar or action.dest.upper()
        names = ", ".join(
            f"`{flag} {metavar}`" if takes else f"`{flag}`" for flag in action.option_strings
        )
    else:
        names = f"`{action.metavar or action.dest}`".replace("|", "\\|")
    text = " ".join((action.help or "").split())
    takes_value = action.option_strings and action.nargs != 0
    if takes_value and action.default not in (None, argparse.SUPPRESS) and "default" not in text:
        text += f" (default: {action.default})"
    text = text.replace("%(default)s", str(action.default)).replace("|", "\\|")
    return f"| {names} | {text} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) the command-line reference.")
    parser.add_argument("page", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    options = parser.parse_args(argv)
    from mmm_orch.cli import build_parser

    made = markdown(build_parser())
    if options.check:
        found = options.page.read_text() if options.page.exists() else ""
        if found != made:
            print(
                f"{options.page} is out of date with the parser: regenerate it with "
                f"`python -m mmm_orch.cli.reference {options.page}`",
                file=sys.stderr,
            )
            return 1
        return 0
    options.page.parent.mkdir(parents=True, exist_ok=True)
    options.page.write_text(made)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
