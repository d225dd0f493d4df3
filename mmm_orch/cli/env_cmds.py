"""Commands about the job's own Python: env create, env check."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "env",
        help="the job environment of a machine: a virtual environment with "
        "mmm-orch on top of its framework module",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        (
            "create",
            "create or update it where the machine's jobs run (here on a "
            "login node, or over SSH), and remember it",
        ),
        (
            "check",
            "run a job's setup lines and activation, and report its "
            "interpreter, mmm-orch and torch versions and device",
        ),
    ):
        q = actions.add_parser(name, help=text)
        q.add_argument("machine", help="machine profile (see `mmm-orch machines`)")
        q.add_argument(
            "--host",
            metavar="HOST",
            help="the login host, as for `submit --host` (default: here when the "
            "scheduler is on PATH, else the profile's first login host)",
        )
        q.add_argument("-A", "--account", help="project, where the default place uses it")
        q.add_argument(
            "--stack",
            metavar="NAME",
            help="the machine's software stack to make it on (default: "
            + ("the profile's default)" if name == "create" else "the one it was made on)"),
        )
        if name == "create":
            q.add_argument(
                "--path",
                metavar="DIR",
                help="where to make it (an absolute path on the machine; default: "
                "the one made before, else the profile's place)",
            )
        q.set_defaults(func=cmd_create if name == "create" else cmd_check)


def _where(args: argparse.Namespace):
    from mmm_orch.usecases import environments

    return environments.where(
        args.machine,
        args.host,
        getattr(args, "path", None),
        args.account,
        args.stack,
        made=args.action == "check",
    )


def cmd_create(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import environments

    at = _where(args)
    report = environments.create(at, print)
    _print_report(at.machine.name, report, at.said)
    print(
        f"jobs on {at.machine.name} (stack {at.stack.name}) now activate {report['prefix']} "
        f"(remembered in {environments.remembered_in()})"
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import environments

    at = _where(args)
    _print_report(at.machine.name, environments.check(at), at.said)
    return 0


def _print_report(machine: str, report: dict, where: str) -> None:
    print(f"job environment of {machine}{where}: {report['prefix']}")
    print(f"  python:   {report['python']}")
    print(f"  mmm-orch: {report['mmm_orch']}")
    print(f"  torch:    {report['torch'] or 'not importable: ' + report.get('torch_error', '')}")
    print(f"  device:   {report['device']} (as this node sees it; compute nodes have the GPUs)")
