"""The mmm-orch command line. Heavy modules (pydantic, jinja2, rich) load only where needed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mmm_orch import __version__
from mmm_orch.errors import MmmError


def _plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("machine", help="machine profile (see `mmm-orch machines`)")
    parser.add_argument("workload", help="workload spec (see `mmm-orch workloads`)")
    parser.add_argument("-N", "--nodes", type=int, help="number of nodes (default: the workload's)")
    parser.add_argument("-q", "--queue", help="queue/partition/QOS (default: the first that fits)")
    parser.add_argument("-t", "--walltime", help="HH:MM:SS (default: the workload's)")
    parser.add_argument("-A", "--account", help="project to charge (or $MMM_ORCH_ACCOUNT)")
    parser.add_argument("--name", help="job name (default: the workload name)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="trainer option (repeatable)")
    parser.add_argument("--env", dest="envs", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment variable for the job (repeatable)")
    parser.add_argument("--preset", dest="presets", action="append", default=[], metavar="NAME",
                        help="enable an environment preset of the machine (repeatable)")
    parser.add_argument("--no-preset", dest="no_presets", action="append", default=[],
                        metavar="NAME", help="disable an environment preset (repeatable)")
    parser.add_argument("--template", help="job script template file to use instead of the default")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmm-orch",
        description="Render, submit and track FSDP/TP training jobs on HPC schedulers.",
    )
    parser.add_argument("--version", action="version", version=f"mmm-orch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("machines", help="list machine profiles")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("workloads", help="list workload specs")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("show", help="show a machine profile or a workload spec")
    p.add_argument("kind", choices=["machine", "workload"])
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("schema", help="JSON Schema of machine profiles or workload specs")
    p.add_argument("kind", choices=["machine", "workload"])

    p = sub.add_parser("render", help="print the job script for a machine and workload")
    _plan_options(p)
    p.add_argument("-o", "--out", help="write the script to this file instead of stdout")
    p = sub.add_parser("submit", help="submit a job (with --dry-run: print its script only)")
    _plan_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    return parser


def _request(args: argparse.Namespace):
    from mmm_orch.plan import Request

    return Request(
        machine=args.machine, workload=args.workload, nodes=args.nodes, queue=args.queue,
        walltime=args.walltime, account=args.account, name=args.name, sets=tuple(args.sets),
        envs=tuple(args.envs), presets=tuple(args.presets), no_presets=tuple(args.no_presets),
    )


def _script(args: argparse.Namespace) -> str:
    from mmm_orch.plan import resolve
    from mmm_orch.render import render

    return render(resolve(_request(args)), args.template)


def _print_script(script: str) -> None:
    if sys.stdout.isatty():
        from mmm_orch import console

        console.print_script(script)
    else:
        sys.stdout.write(script)


def _write_file(path: str, text: str) -> None:
    """Write atomically: a failed write leaves no partial file."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o755)
        tmp.replace(target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise MmmError(f"--out {path!r}: cannot write: {exc.strerror}") from None


def cmd_render(args: argparse.Namespace) -> int:
    script = _script(args)
    if args.out:
        _write_file(args.out, script)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        _print_script(script)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    script = _script(args)
    if args.dry_run:
        _print_script(script)
        return 0
    raise MmmError("submitting is not available in this version: use --dry-run to review the script")


def cmd_list(args: argparse.Namespace) -> int:
    from mmm_orch import console

    rows = console.machine_rows() if args.command == "machines" else console.workload_rows()
    console.print_rows(rows, as_json=args.json, title=args.command)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from mmm_orch import console
    from mmm_orch.config.registry import load_machine, load_workload

    obj = load_machine(args.name) if args.kind == "machine" else load_workload(args.name)
    console.print_model(obj, as_json=args.json)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from mmm_orch.config.yamlio import adapter

    if args.kind == "machine":
        from mmm_orch.config.machine import Machine as cls
    else:
        from mmm_orch.config.workload import Workload as cls
    print(json.dumps(adapter(cls).json_schema(), indent=2))
    return 0


COMMANDS = {
    "machines": cmd_list,
    "workloads": cmd_list,
    "show": cmd_show,
    "schema": cmd_schema,
    "render": cmd_render,
    "submit": cmd_submit,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except MmmError as exc:
        if args.debug:
            raise
        print(f"mmm-orch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `mmm-orch render ... | head`
        sys.stderr.close()
        return 0
    except Exception as exc:  # noqa: BLE001 - one line for users, the traceback with --debug
        if args.debug:
            raise
        print(f"mmm-orch: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
              file=sys.stderr)
        return 1
