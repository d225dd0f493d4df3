"""`mmm-orch allocate`: a held allocation, one batch job that runs the runs sent into it (`submit
--into ID`) while it lives; and `hold`, what that job runs inside its allocation."""

from __future__ import annotations

import argparse
import json
import signal

from mmm_orch.cli import common


def register(sub) -> None:
    p = sub.add_parser(
        "allocate",
        help="hold an allocation that runs the runs sent into it (`submit ... --into ID`) "
        "while it lives, each a job of its own",
    )
    p.add_argument("machine", help="machine profile (see `mmm-orch machines`)")
    for name in ("nodes", "queue", "walltime", "account", "name"):
        common.plan_option(p, name)
    p.add_argument(
        "--after",
        type=common.job_id,
        metavar="ID",
        help="an earlier allocation on this machine: this one also takes the runs sent into "
        "it that it has not started, and those it gave back at its end",
    )
    p.add_argument("--template", help="job script template file to use instead of the default")
    p.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    common.env_check_option(p)
    p.add_argument("--json", action="store_true", help="print the allocation's job record as JSON")
    p.set_defaults(func=cmd_allocate)

    # What an allocation's job runs inside it (usecases/allocations.py), not a command for users.
    p = sub.add_parser("hold")  # (no help: not listed)
    p.add_argument("group", type=int)
    p.set_defaults(func=cmd_hold)


def cmd_allocate(args: argparse.Namespace) -> int:
    from mmm_orch import usecases
    from mmm_orch.usecases import allocations

    request = usecases.Request(
        machine=args.machine,
        workload="command",
        nodes=args.nodes,
        queue=args.queue,
        walltime=args.walltime,
        account=args.account,
        name=args.name,
    )
    prepared = allocations.prepare(
        request,
        args.db,
        args.template,
        after=args.after,
        env_check=not args.no_env_check,
        review=args.dry_run,
    )
    if args.dry_run:
        common.print_script(usecases.render(prepared.plan, args.template))
        return 0
    record = allocations.allocate(prepared, args.db, args.after)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
        return 0
    plan = prepared.plan
    print(
        f"allocation {record.id}: {plan.layout.nodes} node(s) of {plan.machine} for "
        f"{plan.queue.walltime_hms}, queue {plan.queue.name or '-'}, {record.scheduler} id "
        f"{record.native_id}"
    )
    print(f"send runs into it: mmm-orch submit {plan.machine} WORKLOAD ... --into {record.id}")
    return 0


def cmd_hold(args: argparse.Namespace) -> int:
    """Inside an allocation's job: start the runs sent into it until its end. Exit 0 at its
    walltime's end, 143 when stopped (the scheduler's SIGTERM: a cancel, a preemption)."""
    from mmm_orch.usecases import allocations, packs

    def stop(signum, frame):
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)

    def said(text: str) -> None:
        print(packs.in_the_log(text, "allocation"), flush=True)

    try:
        allocations.hold(args.group, args.db, said)
    except KeyboardInterrupt:
        said("stopped by SIGTERM (a cancel, a preemption)")
        return packs.EXIT_STOPPED
    return 0
