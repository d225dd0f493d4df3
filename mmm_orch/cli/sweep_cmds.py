"""Commands about scaling studies: sweep, report, plot."""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import sys

from mmm_orch.cli import common
from mmm_orch.errors import InvalidValue, MmmError


def sweep_id(text: str) -> int:
    """A sweep as `status` shows it (s3) or its number (3)."""
    match = re.fullmatch(r"s?(\d{1,18})", text.strip())
    if not match or int(match[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: a sweep id, like s3 or 3")
    return int(match[1])


def job_or_sweep(text: str) -> tuple[str, int]:
    if text.strip().startswith("s"):
        return "sweep", sweep_id(text)
    return "job", common.job_id(text)


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="submit one job per point of a grid of node counts and "
        "trainer options (with --dry-run: list the points)",
    )
    common.plan_options(p, sweep=True)
    p.add_argument("--dry-run", action="store_true", help="list the points; submit nothing")
    common.env_check_option(p)
    p.add_argument("--json", action="store_true", help="print the jobs' records as JSON")
    common.backlog_option(p)
    p.add_argument("--host", metavar="HOST", help="submit through this login host over SSH")
    p.add_argument(
        "--within",
        action="store_true",
        help="inside an allocation: run the points side by side on its nodes as they "
        'free up, each recorded as a job, in the foreground (see "Many runs in '
        'one allocation")',
    )
    p.add_argument(
        "--pack",
        action="store_true",
        help="submit one job whose allocation runs the points side by side as its "
        'nodes free up, each still recorded as a job (see "Many runs in one '
        'allocation")',
    )
    p.add_argument(
        "--devices",
        metavar="D[,D...]",
        help="with --pack or --within: points on D devices (GPUs, tiles, GCDs) of one "
        "node each, side by side with others on the rest; beside --nodes, more "
        "points",
    )
    p.add_argument(
        "--pack-nodes",
        type=int,
        metavar="N",
        help="with --pack: the pack job's nodes (default: the largest point's)",
    )
    p.add_argument(
        "--pack-walltime",
        metavar="HH:MM:SS",
        help="with --pack: the pack job's walltime (default: enough for the waves its "
        "points run in, each --walltime long)",
    )
    p.set_defaults(func=cmd_sweep, workdir=None)

    # What a pack job runs inside its allocation (usecases/packs.py), not a command for users.
    p = sub.add_parser("pack-run")  # (no help: not listed)
    p.add_argument("sweep", type=int)
    p.set_defaults(func=cmd_pack_run)

    p = sub.add_parser(
        "report",
        help="a scaling report of a sweep (s3) or of jobs: table, "
        "figures and one self-contained report.html",
    )
    p.add_argument("targets", nargs="+", type=job_or_sweep, metavar="SWEEP|JOB")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where the figures and report.html go "
        "(default: ./report-s<ID> or ./report-jobs-<IDS>)",
    )
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("plot", help="one job's loss and throughput curves, as a PNG")
    p.add_argument("job", type=common.job_id, metavar="JOB")
    p.add_argument("--out", metavar="FILE", help="the PNG (default: ./job-<ID>.png)")
    p.set_defaults(func=cmd_plot)


def cmd_sweep(args: argparse.Namespace) -> int:
    from mmm_orch import usecases
    from mmm_orch.usecases import hours, sweep_cost

    if args.backlog and (args.pack or args.within):
        raise InvalidValue(
            "--backlog",
            "with --pack" if args.pack else "with --within",
            "only for points submitted as jobs of their own (a pack's or an allocation's "
            "points already wait for its nodes)",
        )
    if args.pack or args.pack_nodes is not None or args.pack_walltime is not None:
        return _pack(args)
    if args.within and not args.dry_run:
        return _within(args)

    swept, planned = usecases.sweep_points(
        common.request(args, nodes=None, options=()),
        args.nodes,
        args.options,
        args.db,
        args.template,
        args.host,
        review=args.dry_run,
        devices=args.devices,
        within=args.within,
        backlog=args.backlog,
    )
    if args.dry_run:
        print(
            f"sweep of {planned[0].plan.workload} on {planned[0].plan.machine}: "
            f"{len(planned)} points (nothing submitted)"
        )
        for point in planned:
            plan = point.plan
            mesh = " ".join(f"{k}={v}" for k, v in plan.layout.mesh.items())
            print(
                f"  {point.index:>3}  {point.label:<32} queue {plan.queue.name or '-'}, "
                f"{plan.layout.nodes} nodes x {plan.layout.ranks_per_node} = {plan.layout.ranks} ranks, mesh {mesh}, "
                f"walltime {plan.queue.walltime_hms}, at most {hours(plan.cost.most)} {plan.cost.unit}"
            )
        for point in planned:  # a queue taken for its job limits says why
            if "job limits" in point.plan.queue.reason:
                print(
                    f"  point {point.index}: queue {point.plan.queue.name}, "
                    f"{point.plan.queue.reason}"
                )
        print(sweep_cost(planned))
        return 0
    sweep, records, notes = usecases.submit_sweep(
        swept,
        planned,
        args.db,
        args.template,
        args.host,
        env_check=not args.no_env_check,
        backlog=args.backlog,
    )
    common.tell(notes)
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
        return 0
    span = f"{records[0].id}-{records[-1].id}"
    if args.backlog:
        sent = sum(1 for r in records if r.native_id)
        print(
            f"sweep {sweep}: {len(records)} jobs, {span}: {sent} submitted, "
            f"{len(records) - sent} waiting in the backlog"
        )
    else:
        print(f"sweep {sweep}: {len(records)} jobs submitted, {span}")
    for point, record in zip(planned, records, strict=True):  # one record per point
        where = f"{record.scheduler} id {record.native_id}" if record.native_id else "waiting"
        print(f"  job {record.id}: {point.label} ({where})")
    print(f"follow it: mmm-orch status --sweep {sweep}; then: mmm-orch report s{sweep}")
    return 0


def _pack(args: argparse.Namespace) -> int:
    """`sweep --pack`: one job runs the points (usecases/packs.py)."""
    from mmm_orch.usecases import packs, render

    if not args.pack:
        flag, value = (
            ("--pack-nodes", args.pack_nodes)
            if args.pack_nodes is not None
            else ("--pack-walltime", args.pack_walltime)
        )
        raise InvalidValue(flag, value, "only with --pack")
    if args.within:
        raise InvalidValue(
            "--pack",
            "with --within",
            "one of them: --pack submits a job for the "
            "points, --within runs them in the allocation this runs in",
        )
    pack = packs.pack_points(
        common.request(args, nodes=None, options=()),
        args.nodes,
        args.options,
        args.pack_nodes,
        args.pack_walltime,
        args.db,
        args.template,
        args.host,
        env_check=not args.no_env_check,
        review=args.dry_run,
        devices=args.devices,
    )
    if args.dry_run:
        common.print_script(render(pack.job.plan, args.template))
        print("\n".join(packs.review_lines(pack)))
        return 0
    sweep, record = packs.submit_pack(pack, args.db)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
        return 0
    print(
        f"sweep {sweep}: pack job {record.id} ({record.scheduler} id {record.native_id}) runs "
        f"its {len(pack.points)} points on {record.nodes} node(s)"
    )
    print(f"follow it: mmm-orch status --sweep {sweep}; then: mmm-orch report s{sweep}")
    return 0


def cmd_pack_run(args: argparse.Namespace) -> int:
    """Inside a pack job: its sweep's recorded points, side by side on its nodes. Exit 0 when
    every point completed, 1 when one did not, 143 when stopped (the scheduler's SIGTERM at a
    cancel or the walltime: the running points are cancelled, those waiting not started)."""
    from mmm_orch.usecases import packs

    def stop(signum, frame):
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)

    def said(text: str) -> None:
        print(packs.in_the_log(text), flush=True)

    try:
        records = packs.run_pack(args.sweep, args.db, said)
    except KeyboardInterrupt:
        said("stopped: the running points were cancelled, the waiting ones not started")
        return packs.EXIT_STOPPED
    counts = collections.Counter(record.state.value for record in records)
    said(
        f"sweep {args.sweep}: {len(records)} points ("
        + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        + ")"
    )
    return 0 if set(counts) == {"completed"} else 1


def _within(args: argparse.Namespace) -> int:
    """`sweep --within`: the points run in this allocation; exit 0 when every one completed, 1
    when one did not, 130 when stopped (Ctrl-C, SIGTERM, SIGHUP: the running points too)."""
    from mmm_orch.usecases import inside

    if args.host is not None:
        raise MmmError(f"--host {args.host!r}: --within runs the points here, in this allocation")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    for stop in inside.stop_signals():
        signal.signal(stop, interrupt)

    def said(text: str) -> None:
        print(f"mmm-orch: {text}", file=sys.stderr, flush=True)

    try:
        sweep, records = inside.sweep_within(
            common.request(args, nodes=None, options=()),
            args.nodes,
            args.options,
            args.db,
            args.template,
            env_check=not args.no_env_check,
            said=said,
            devices=args.devices,
        )
    except KeyboardInterrupt:
        said("stopped: the running points were cancelled")
        return 130
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
    else:
        counts = collections.Counter(r.state.value for r in records)
        ended = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        print(
            f"sweep {sweep}: {len(records)} points run in this allocation ({ended}); "
            f"mmm-orch status --sweep {sweep}; mmm-orch report s{sweep}"
        )
    return 0 if all(r.state.value == "completed" for r in records) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import following, reports

    chosen = reports.targets(following.open_jobs(args.db), args.targets)
    made = reports.report(chosen, args.out or chosen.default_out)
    if args.json:
        print(json.dumps(reports.rows(made), indent=2))
    else:
        sys.stdout.write(reports.text(made))
    where = sys.stderr if args.json else sys.stdout
    for path in made.figures:
        print(f"figure: {path}", file=where)
    print(f"report: {made.page}", file=where)
    if made.hint:
        print(f"mmm-orch: {made.hint}", file=sys.stderr)
    if note := reports.notes(made):
        print(note, file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import following, reports

    path, note = reports.plot(following.open_jobs(args.db), args.job, args.out)
    print(f"figure: {path}")
    if note:
        print(note, file=sys.stderr)
    return 0
