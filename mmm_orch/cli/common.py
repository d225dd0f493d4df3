"""What the command groups share: the argument parser with one-line errors, typed arguments, the
plan options of render/submit/sweep, and opening the job database."""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any, NoReturn

from mmm_orch.cli import console
from mmm_orch.errors import MmmError
from mmm_orch.limits import MAX_LINKS  # a constant: the use cases' import would cost start-up

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


def plan_options(
    parser: argparse.ArgumentParser, sweep: bool = False, machine_found: bool = False
) -> None:
    """The options that make a plan (render, submit); a sweep takes lists of nodes and values;
    `machine_found`: MACHINE may be left out (launch finds it from the host names)."""
    if machine_found:
        parser.add_argument(
            "machine",
            nargs="?",
            default="",
            help="machine profile (default: the one whose hostnames match the "
            "allocation's nodes, or this host; see `mmm-orch machines`)",
        )
    else:
        parser.add_argument("machine", help="machine profile (see `mmm-orch machines`)")
    parser.add_argument(
        "workload",
        nargs="?",
        help="workload spec (see `mmm-orch workloads`); leave it out to run "
        "your own command, given after --",
    )
    parser.set_defaults(takes_program=True)
    if sweep:
        parser.add_argument(
            "-N",
            "--nodes",
            metavar="N1,N2,...",
            help="node counts to sweep (default: the workload's)",
        )
    else:
        parser.add_argument(
            "-N", "--nodes", type=count, help="number of nodes (default: the workload's)"
        )
    parser.add_argument("-q", "--queue", help="queue/partition/QOS (default: the first that fits)")
    parser.add_argument("-t", "--walltime", help="HH:MM:SS (default: the workload's)")
    parser.add_argument("-A", "--account", help="project to charge (or $MMM_ORCH_ACCOUNT)")
    parser.add_argument("--name", help="job name (default: the workload name)")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=V1,V2,..." if sweep else "KEY=VALUE",
        help="trainer option values to sweep (a comma in a value: \\,; repeatable)"
        if sweep
        else "trainer option (repeatable)",
    )
    parser.add_argument(
        "--init-from",
        metavar="PATH",
        help="start from pretrained weights: a Hugging Face model directory or Meta's "
        "(params.json, consolidated.*.pth); checked against the model before the queue",
    )
    parser.add_argument(
        "--profile",
        metavar="TOOL",
        help="profile a window of steps: torch (torch.profiler traces; `mmm-orch profile JOB`) "
        "or the machine's profiler (nsys, unitrace, rocprof: `mmm-orch show machine M`)",
    )
    parser.add_argument(
        "--env",
        dest="envs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment variable for the job (repeatable)",
    )
    parser.add_argument(
        "--preset",
        dest="presets",
        action="append",
        default=[],
        metavar="NAME",
        help="enable an environment preset of the machine (repeatable)",
    )
    parser.add_argument(
        "--no-preset",
        dest="no_presets",
        action="append",
        default=[],
        metavar="NAME",
        help="disable an environment preset (repeatable)",
    )
    parser.add_argument(
        "--stack",
        metavar="NAME",
        help="the machine's software stack (modules) to run on (default: the profile's "
        "default; `mmm-orch show machine M` lists them)",
    )
    parser.add_argument("--template", help="job script template file to use instead of the default")
    parser.add_argument(
        "--spare-nodes",
        type=lines,
        default=0,
        metavar="K",
        help="ask for K nodes more than --nodes: when a node fails, the job swaps "
        "in a spare and relaunches from the last checkpoint",
    )
    parser.add_argument(
        "--max-node-hours",
        metavar="H",
        help="refuse a plan that can be charged more than H node-hours (a sweep: "
        "all its points; a chain: it stops linking before it would pass H)",
    )
    parser.add_argument(
        "--stage-env",
        action="store_true",
        help="copy the job environment to node-local storage on every node "
        "before the launch (imports then stay off the shared filesystem)",
    )


def request(args: argparse.Namespace, **overrides: Any):
    from mmm_orch.usecases import Request

    program = tuple(getattr(args, "program", ()))
    if args.workload is None and not program:
        raise MmmError(
            "workload is missing: name one (`mmm-orch workloads`), or give your own "
            "command after --, e.g. `-- python3 -m mypkg.train`"
        )
    fields = dict(
        machine=args.machine,
        workload=args.workload or "command",
        command=program,
        nodes=args.nodes,
        queue=args.queue,
        walltime=args.walltime,
        account=args.account,
        name=args.name,
        sets=tuple(args.sets),
        envs=tuple(args.envs),
        presets=tuple(args.presets),
        no_presets=tuple(args.no_presets),
        workdir=getattr(args, "workdir", None),
        stage_env=args.stage_env,
        spare_nodes=args.spare_nodes,
        max_node_hours=args.max_node_hours,
        jobs=max(getattr(args, "chain", None) or 1, 1),
        init_from=args.init_from,
        profile=args.profile,
        stack=args.stack,
    )  # a chain puts its links in the queue
    fields.update(overrides)
    return Request(**fields)


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
