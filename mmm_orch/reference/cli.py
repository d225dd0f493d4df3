"""The command-line reference (docs/reference/cli.md), made from the argument parser itself:
every command, its usage, its options and their help."""

from __future__ import annotations

import argparse

from mmm_orch.cli import build_parser
from mmm_orch.cli.manual import PAGES, commands
from mmm_orch.reference import header


def markdown() -> str:
    """The page: the global options, then each command (and sub-command) in the parser's order."""
    parser = build_parser()
    intro = header(
        "Command-line reference",
        "mmm-orch's argument parser",
        "`mmm-orch COMMAND --help` says the same.",
    )
    sections = [intro, _section(parser, "mmm-orch", "")]
    sections += [_section(sub, name, said) for name, sub, said in commands(parser)]
    return "\n".join(sections).rstrip() + "\n"


def _section(parser: argparse.ArgumentParser, name: str, said: str) -> str:
    lines = [f"## `{name}`", ""]
    for text in (said, parser.description):
        if text and " ".join(text.split()) not in lines:
            lines += [" ".join(text.split()), ""]
    if name != "mmm-orch":
        page = PAGES[name.split()[0]]
        lines += [f"In the manual: [{page}](../{page}).", ""]
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
