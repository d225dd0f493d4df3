"""Commands about what runs cost: usage (what was spent), balance (what the allocation has left)."""

from __future__ import annotations

import argparse
import json
import sys

from mmm_orch.cli import common
from mmm_orch.errors import one_line


def register(sub) -> None:
    p = sub.add_parser(
        "usage",
        help="node-hours charged to the jobs recorded here, by machine "
        "and account (and workload, sweep, chain or day)",
    )
    p.add_argument("-m", "--machine", help="only jobs on this machine")
    p.add_argument("-A", "--account", help="only jobs charged to this project")
    p.add_argument(
        "--since",
        metavar="DATE",
        help="only jobs that ended on or after DATE (YYYY-MM-DD, or YYYY-MM-DDTHH:MM)",
    )
    p.add_argument(
        "--by",
        choices=None,
        metavar="workload|sweep|chain|day",
        help="one row per workload, sweep, chain or day as well",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser(
        "balance",
        help="a project's allocation and what remains, from the "
        "facility's tool (sbank, showusage), here or on the login host",
    )
    p.add_argument("machine", help="machine profile (see `mmm-orch machines`)")
    p.add_argument("-A", "--account", help="the project (default: the profile's)")
    p.add_argument("--host", metavar="HOST", help="run the tool on this login host over SSH")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_balance)


def cmd_usage(args: argparse.Namespace) -> int:
    from mmm_orch import usecases

    db = common.jobs_db(args)
    common.check_machine(args.machine, db)
    rows, warnings = usecases.usage(db, args.machine, args.account, args.since, args.by)
    for warning in warnings:
        print(f"mmm-orch: warning: {one_line(warning)}", file=sys.stderr)
    if args.json:
        print(json.dumps(usecases.usage_dicts(rows), indent=2))
    elif rows:
        # One line a row, whatever names a record holds (a database recovered from job
        # directories holds what their files say).
        text = usecases.usage_text(rows, args.by)
        sys.stdout.write("".join(one_line(line) + "\n" for line in text.splitlines()))
    else:
        print(
            "no jobs recorded"
            + (" that match" if args.machine or args.account or args.since else "")
        )
    return 0


def cmd_balance(args: argparse.Namespace) -> int:
    from mmm_orch import usecases
    from mmm_orch.usecases import hours

    found = usecases.balance(args.machine, args.account, args.host)
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
        return 0
    # The projects, resources and notes are the tool's words: each line shown escaped (a line
    # break or a terminal escape from the tool would forge or hide a line).
    if not found.allocations:
        print(one_line(f"{found.machine}: no balance: {found.note}"))
        return 0
    for a in found.allocations:
        awarded = f" of {hours(a.allocation)}" if a.allocation is not None else ""
        period = f", {a.start} to {a.end}" if a.start else ""
        print(
            one_line(
                f"{found.machine} {a.project}{' (' + a.resource + ')' if a.resource else ''}: "
                f"{hours(a.remaining)} node-hours left{awarded} ({hours(a.used)} used{period})"
            )
        )
    return 0
