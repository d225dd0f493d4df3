"""Commands about profiles, specs and scripts: machines, workloads, show, schema, render."""

from __future__ import annotations

import argparse
import json
import sys

from mmm_orch.cli import common, console
from mmm_orch.errors import MmmError


def register(sub) -> None:
    p = sub.add_parser(
        "machines",
        help="list machine profiles; `machines check MACHINE`: where "
        "its queues differ from the live scheduler's and its software stacks from what "
        "loads (exit 1 when they do)",
        usage="mmm-orch machines [--json] | machines check MACHINE [--host HOST] "
        "[--timeout SECONDS] [--json]",
    )
    p.add_argument("action", nargs="?", choices=["check"], help=argparse.SUPPRESS)
    p.add_argument("name", nargs="?", metavar="MACHINE", help=argparse.SUPPRESS)
    p.add_argument(
        "--host",
        metavar="HOST",
        help="ask the scheduler and load the stacks on this login host over SSH "
        "(default: as submit does)",
    )
    p.add_argument(
        "--timeout",
        type=common.seconds,
        metavar="SECONDS",
        help="give up on a stack whose loading takes longer (a module that hangs); default 120",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_machines)
    p = sub.add_parser("workloads", help="list workload specs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser(
        "show",
        help="show a job (script, plan, history), a machine profile or a workload spec",
        usage="mmm-orch show JOB | machine NAME | workload NAME",
    )
    p.add_argument("what", metavar="JOB|machine|workload")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("schema", help="JSON Schema of machine profiles or workload specs")
    p.add_argument("kind", choices=["machine", "workload"])
    p.set_defaults(func=cmd_schema)
    p = sub.add_parser("render", help="print the job script for a machine and workload")
    common.plan_options(p)
    p.add_argument("-o", "--out", help="write the script to this file instead of stdout")
    p.set_defaults(func=cmd_render)


def script(args: argparse.Namespace) -> str:
    from mmm_orch.usecases import script

    return script(common.request(args), args.db, args.template)


def cmd_render(args: argparse.Namespace) -> int:
    from mmm_orch import usecases

    text = script(args)
    if args.out:
        usecases.save(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        common.print_script(text)
    return 0


def cmd_machines(args: argparse.Namespace) -> int:
    if args.action is None:
        if args.name is not None or args.host is not None:
            raise MmmError(
                "machines: list them with `mmm-orch machines`, check one with "
                "`mmm-orch machines check MACHINE [--host HOST]`"
            )
        return cmd_list(args)
    if args.name is None:
        raise MmmError("machines check: name the MACHINE whose profile to check")
    from mmm_orch.usecases.machines import check_machine, check_software, has_scheduler

    if args.timeout is not None and args.timeout > 3600:
        raise MmmError(f"--timeout {args.timeout:g}: seconds a stack may take, at most 3600")
    queues = has_scheduler(args.name)
    differences = check_machine(args.name, args.host) if queues else []
    stacks = check_software(args.name, args.host, args.timeout)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": args.name,
                    "differences": differences,
                    "stacks": {c.stack: {"findings": c.findings, "read": c.read} for c in stacks},
                },
                indent=2,
            )
        )
    else:
        if differences:
            print(
                f"{args.name}: {len(differences)} difference{'s' if len(differences) > 1 else ''} "
                "between the profile and the live scheduler:"
            )
            for line in differences:
                print(f"  {line}")
        elif queues:
            print(f"{args.name}: the profile's queues match the live scheduler")
        else:
            print(
                f"{args.name}: no scheduler's queues to compare"
                + ("" if stacks else ", and no stack with lines, `gives` or `sets` to load")
            )
        for check in stacks:
            print(_stack_report(args.name, check))
    return 1 if differences or any(c.findings for c in stacks) else 0


def _stack_report(machine: str, check) -> str:
    from mmm_orch.errors import one_line

    read = one_line(
        ", ".join(
            f"{key} {value}" if key in ("python", "torch") else f"{key}={value}"
            for key, value in check.read.items()
        )
    )
    if not check.findings:
        return (
            f"{machine}: stack {check.stack} loads as the profile says ({read or 'nothing read'})"
        )
    count = len(check.findings)
    return "\n".join(
        [
            f"{machine}: stack {check.stack}: {count} difference{'s' if count > 1 else ''} "
            "between the profile and what loads:"
        ]
        + [f"  {one_line(line)}" for line in check.findings]
    )


def cmd_list(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import machines

    rows = machines.machine_rows() if args.command == "machines" else machines.workload_rows()
    console.print_rows(rows, as_json=args.json, title=args.command)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if args.name is None and args.what.isdigit():
        from mmm_orch.cli import view

        try:
            job_id = common.job_id(args.what)
        except argparse.ArgumentTypeError as exc:
            raise MmmError(f"show: {exc}") from None
        record = common.job(common.jobs_db(args), job_id)
        print(view.details_json(record) if args.json else view.details(record))
        return 0
    if args.what not in ("machine", "workload") or not args.name:
        raise MmmError(f"show {args.what!r}: expected a job id, 'machine NAME' or 'workload NAME'")
    from mmm_orch.usecases import machines

    console.print_model(machines.show(args.what, args.name, whole=args.json), as_json=args.json)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import machines

    print(json.dumps(machines.schema(args.kind), indent=2))
    return 0
