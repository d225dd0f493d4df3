"""The mmm-orch command line: one module per command group, each adding its commands to the
parser, and the use cases it runs (mmm_orch.usecases: nothing below them) imported inside each
command: the parser loads every command module, and the use cases it does not run would cost
tens of milliseconds at start-up. Heavy modules (pydantic, jinja2, rich, paramiko, torch) load
only where a command needs them, so that every command starts at once."""

from __future__ import annotations

import sys

from mmm_orch.cli import (
    alloc_cmds,
    config_cmds,
    db_cmds,
    env_cmds,
    export_cmds,
    inspect_cmds,
    job_cmds,
    launch_cmds,
    nodes_cmds,
    sweep_cmds,
    usage_cmds,
)
from mmm_orch.cli.common import ArgParser
from mmm_orch.cli.manual import link_pages
from mmm_orch.errors import MmmError, one_line
from mmm_orch.version import __version__

GROUPS = (
    config_cmds,
    job_cmds,
    launch_cmds,
    sweep_cmds,
    alloc_cmds,
    usage_cmds,
    inspect_cmds,
    export_cmds,
    env_cmds,
    nodes_cmds,
    db_cmds,
)


def build_parser() -> ArgParser:
    parser = ArgParser(
        prog="mmm-orch",
        description="Render, submit and track FSDP/TP training jobs on HPC schedulers.",
        epilog="The manual: README.md and docs/ in the source (`mkdocs serve` shows it as a "
        "site); every command and option: docs/reference/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"mmm-orch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument(
        "--db",
        metavar="PATH",
        help="job database (default: $MMM_ORCH_DB or $XDG_STATE_HOME/mmm-orch/jobs.db)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    link_pages(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Everything after the first `--` is the user's own program (render, submit, sweep), taken
    # word for word: argparse would read its options as mmm-orch's.
    argv = sys.argv[1:] if argv is None else list(argv)
    at = argv.index("--") if "--" in argv else len(argv)
    program = argv[at + 1 :] if at < len(argv) else None
    args = build_parser().parse_args(argv[:at])
    args.program = tuple(program or ())
    args.words = argv[:at]  # as typed (launch --allocate runs them again inside the allocation)
    if program is not None and not getattr(args, "takes_program", False):
        print(
            f"mmm-orch: error: `mmm-orch {args.command}` runs no command of yours: nothing may "
            "follow --",
            file=sys.stderr,
        )
        return 2
    if program == []:
        print(
            "mmm-orch: error: command after -- is missing: name the program to run, e.g. "
            "`-- python3 -m mypkg.train`",
            file=sys.stderr,
        )
        return 2
    try:
        from mmm_orch.usecases import check_settings

        check_settings()  # a bad MMM_ORCH_RETRY_DEADLINE is refused before anything runs
        return args.func(args)
    except MmmError as exc:
        if args.debug:
            raise
        print(f"mmm-orch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("mmm-orch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `mmm-orch render ... | head`
        sys.stderr.close()
        return 0
    except Exception as exc:  # noqa: BLE001 - one line for users, the traceback with --debug
        if args.debug:
            raise
        print(
            f"mmm-orch: internal error: {type(exc).__name__}: {one_line(str(exc))} (rerun "
            "with --debug)",
            file=sys.stderr,
        )
        return 1
    finally:
        # One SSH connection and one database connection per command, closed at its end.
        for module in ("mmm_orch.hosts", "mmm_orch.records.db"):
            if module in sys.modules:
                sys.modules[module].close_all()
