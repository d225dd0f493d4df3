"""Commands about nodes known to be bad: nodes, nodes forget."""

from __future__ import annotations

import argparse
import json
import time

from mmm_orch.errors import one_line


def register(sub) -> None:
    p = sub.add_parser(
        "nodes",
        help="nodes remembered as bad (retired by failover or blamed by "
        "diagnose); later jobs on the machine avoid them",
    )
    p.add_argument("-m", "--machine", help="only this machine's")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    q = actions.add_parser("forget", help="stop avoiding a node")
    q.add_argument("node")
    q.add_argument("-m", "--machine", help="only on this machine (default: every machine)")
    q.set_defaults(func=cmd_forget)


def cmd_list(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import database

    rows = database.bad_nodes(args.db, args.machine)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no node is remembered as bad" + (f" on {args.machine}" if args.machine else ""))
        return 0
    days = database.bad_node_expiry_days()
    print(f"{'MACHINE':<12} {'NODE':<20} {'JOB':>5}  {'SINCE':<16} {'EXPIRES':<16} EVIDENCE")
    for row in rows:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["at"]))
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["at"] + days * 86400))
        print(  # the node and the evidence are a job log's words: one line, escaped
            one_line(
                f"{row['machine']:<12} {row['node']:<20} {row['job_id'] or '-':>5}  {since:<16} "
                f"{expires:<16} {row['evidence'][:90]}"
            )
        )
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import database

    gone = database.forget_node(args.db, args.node, args.machine)
    print(
        f"forgot {args.node}" + (f" on {args.machine}" if args.machine else f" ({gone} machines)")
    )
    return 0
