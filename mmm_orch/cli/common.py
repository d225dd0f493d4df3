"""What the command groups share: the argument parser with one-line errors, typed arguments, the
plan options of render/submit/sweep, and opening the job database."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any, NoReturn

from mmm_orch.cli import console
from mmm_orch.errors import MmmError
from mmm_orch.limits import MAX_LINKS  # a constant: the use cases' import would cost start-up
from mmm_orch.options.plan import PlanOptions, option_fields, pairs

MAX_JOB_ID = 2**63 - 1  # SQLite's largest integer


class _Formatter(argparse.HelpFormatter):
    """argparse's, never breaking a word at its hyphen: a name or a link (`pack-run`,
    `docs/...#db-recover`) stays whole to be copied."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = " ".join(text.split())
        return textwrap.fill(
            text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )


class ArgParser(argparse.ArgumentParser):
    """argparse, with its errors as one line (`mmm-orch: error: ...`, exit 2), not a usage block,
    and its help text wrapped between words only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # "argument -N/--nodes: 'x' is invalid: ..." reads "--nodes 'x' is invalid: ...".
        if match := re.match(r"argument (?:\S+/)?(\S+): (.*)", message, re.S):
            message = f"{match[1]} {match[2]}"
        command = self.prog.removeprefix("mmm-orch").strip()
        print(
            f"mmm-orch: error: {command + ': ' if command else ''}{' '.join(message.split())} "
            f"(see `{self.prog} --help`)",
            file=sys.stderr,
        )
        raise SystemExit(2)


def _bounded_int(low: int, high: int | None, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            limit = f"{low}-{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: {what} {limit}")
        return value

    parse.__name__ = what
    return parse


count = _bounded_int(1, None, "a whole number")  # nodes, links, ...
lines = _bounded_int(0, None, "a whole number")  # --tail
job_id = _bounded_int(1, MAX_JOB_ID, "a job id,")
links = _bounded_int(1, MAX_LINKS, "a number of links,")


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: seconds, a number greater than 0")
    return value


# What each kind of plan option (options/plan.py) is on the command line.
_KINDS: dict[str, dict[str, Any]] = {
    "text": {},
    "count": {"type": count},
    "spare": {"type": lines},
    "flag": {"action": "store_true"},
    "budget": {},  # planning reads the text (cost.parse_budget)
    "names": {"action": "append", "default": []},
    "settings": {"action": "append", "default": []},
    "variables": {"action": "append", "default": []},
}
# A sweep's --nodes and --set take lists of values: the points' axes (submission/sweeps.py).
_SWEPT: dict[str, dict[str, Any]] = {
    "nodes": {"metavar": "N1,N2,...", "help": "node counts to sweep (default: the workload's)"},
    "options": {
        "metavar": "KEY=V1,V2,...",
        "help": "trainer option values to sweep (a comma in a value: \\,; repeatable)",
        "action": "append",
        "default": [],
    },
}


def plan_options(
    parser: argparse.ArgumentParser, sweep: bool = False, machine_found: bool = False
) -> None:
    """The options that make a plan (render, submit, launch), as options/plan.py defines them;
    a sweep takes lists of nodes and values; `machine_found`: MACHINE may be left out (launch
    finds it from the host names)."""
    machine, workload = dataclasses.fields(PlanOptions)[:2]
    if machine_found:
        parser.add_argument(
            "machine",
            nargs="?",
            default="",
            help="machine profile (default: the one whose hostnames match the "
            "allocation's nodes, or this host; see `mmm-orch machines`)",
        )
    else:
        parser.add_argument("machine", help=machine.metadata["help"])
    parser.add_argument("workload", nargs="?", help=workload.metadata["help"])
    parser.set_defaults(takes_program=True)
    for option in option_fields():
        if option.metadata["flags"] and not option.metadata["alone"]:
            plan_option(parser, option.name, sweep)
    parser.add_argument("--template", help="job script template file to use instead of the default")


def plan_option(parser: argparse.ArgumentParser, name: str, sweep: bool = False) -> None:
    """The command-line flag of plan option `name`."""
    option = next(f for f in option_fields() if f.name == name)
    said = option.metadata
    settings: dict[str, Any] = {"help": said["help"], "default": option.default}
    settings |= _KINDS[said["kind"]]
    if said["metavar"]:
        settings["metavar"] = said["metavar"]
    if sweep and name in _SWEPT:
        settings = _SWEPT[name]
    parser.add_argument(*said["flags"], dest=name, **settings)


def request(args: argparse.Namespace, **overrides: Any):
    """The Request the command line's plan options ask for (`overrides`: what a command decides
    itself), its KEY=VALUE words split here, as the Python API is given them."""
    from mmm_orch.usecases import Request

    program = tuple(getattr(args, "program", ()))
    if args.workload is None and not program:
        raise MmmError(
            "workload is missing: name one (`mmm-orch workloads`), or give your own "
            "command after --, e.g. `-- python3 -m mypkg.train`"
        )
    given: dict[str, Any] = {
        "machine": args.machine,
        "workload": args.workload or "command",
        "command": program,
        "jobs": max(getattr(args, "chain", None) or 1, 1),  # a chain puts its links in the queue
    }
    for option in option_fields():
        kind, flags = option.metadata["kind"], option.metadata["flags"]
        if not flags or option.name in overrides:
            continue
        value: Any = getattr(args, option.name, option.default)  # (--workdir: submit's own)
        if kind in ("settings", "variables"):
            value = pairs(value, flags[-1])
        given[option.name] = tuple(value) if kind == "names" else value
    return Request(**given, **overrides)


def env_check_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-env-check",
        action="store_true",
        help="skip the check that the job's Python imports this mmm-orch",
    )


def backlog_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="what the queue's job limits do not admit now waits in the backlog, each run "
        "recorded, and is submitted as your jobs there end (`mmm-orch backlog`, `status`)",
    )


def tell(notes: tuple[str, ...]) -> None:
    """A submission's notes, once it is made: on stderr, as the CLI's other notes."""
    for note in notes:
        print(f"mmm-orch: {note}", file=sys.stderr)


def print_script(script: str) -> None:
    if sys.stdout.isatty():
        console.print_script(script)
    else:
        sys.stdout.write(script)


def jobs_db(args: argparse.Namespace, create: bool = False):
    """The checked job database, or None when there is none yet (and `create` is False)."""
    from mmm_orch.usecases import following

    return following.open_jobs(args.db, create=create)


def job(db, job_id: int):
    """The record of `job_id`, or an error that says which ids exist."""
    from mmm_orch.usecases import following

    return following.job(db, job_id)


def check_machine(name: str | None, db) -> None:
    """A --machine filter must name a profile or a machine jobs were recorded on."""
    from mmm_orch.usecases import following

    following.check_known("machines", name, db)
