"""`mmm-orch launch`: run a plan (a workload, or your command after --) inside the allocation
this shell is in, in the foreground, recorded as a job."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys

from mmm_orch.cli import common
from mmm_orch.cli.job_cmds import follow
from mmm_orch.errors import MmmError


def register(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run a workload or your command (after --) inside the "
        "allocation you are in (salloc, qsub -I, a batch script), in the "
        "foreground, recorded as a job",
    )
    common.plan_options(p, machine_found=True)
    p.add_argument(
        "--first-node",
        type=common.lines,
        default=0,
        metavar="I",
        help="start at the allocation's node I (from 0): launches side by side on "
        "disjoint nodes take --nodes K --first-node 0, K, 2K, ...",
    )
    p.add_argument(
        "--use-bad-nodes",
        action="store_true",
        help="also run on nodes remembered as bad (`mmm-orch nodes`)",
    )
    p.add_argument(
        "--allocate",
        action="store_true",
        help="outside an allocation: get one for this plan (salloc, qsub -I with the "
        "profile's account, queue and walltime) and launch inside it",
    )
    p.add_argument("--report-to", help=argparse.SUPPRESS)  # the exit code, for --allocate
    p.add_argument("--dry-run", action="store_true", help="print the script; run nothing")
    common.env_check_option(p)
    p.set_defaults(func=cmd_launch)


def cmd_launch(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import inside, machines

    if args.machine and args.workload is None and not machines.is_machine(args.machine):
        args.machine, args.workload = "", args.machine  # `launch WORKLOAD`: the machine is found
    if args.allocate:
        words = [word for word in args.words if word not in ("--allocate", "--dry-run")]
        if args.dry_run:
            _, argv = inside.allocation_for_launch(
                common.request(args), words, args.program, "REPORT", args.db
            )
            print(shlex.join(argv))
            return 0
        return inside.launch_in_a_new_allocation(common.request(args), words, args.program, args.db)
    try:
        code = _launch(args)
    except MmmError as exc:
        _report(args, exc.exit_code)
        raise
    _report(args, code)
    return code


def _launch(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import inside, render

    prepared = inside.launch(
        common.request(args),
        args.db,
        args.template,
        args.first_node,
        args.use_bad_nodes,
        env_check=not (args.no_env_check or args.dry_run),
    )
    if args.dry_run:
        common.print_script(render(prepared.plan, args.template))
        return 0
    record = inside.submit_here(prepared, args.db)
    print(f"mmm-orch: job {record.id}: {prepared.plan.launch_line}", file=sys.stderr)
    print(f"mmm-orch: log {record.log_path}", file=sys.stderr)
    return _in_the_foreground(args, record)


def _report(args: argparse.Namespace, code: int) -> None:
    if args.report_to:  # for `launch --allocate` outside the allocation
        from mmm_orch.usecases import inside

        inside.write_exit_report(args.report_to, code)


def _in_the_foreground(args: argparse.Namespace, record) -> int:
    """Stream the job's output until it ends and exit with its code. Ctrl-C, SIGTERM or SIGHUP
    (the terminal or the allocation gone; not under nohup) stops it as `mmm-orch cancel` would: every rank on
    every node, a trainer saving first; exit 130. Killed outright, this process leaves the job
    to its supervisor, which stops it the same way (it holds the job: schedulers/local/supervisor.py)."""
    from mmm_orch import usecases
    from mmm_orch.usecases import following, inside

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    stops = inside.stop_signals()
    for stop in stops:
        signal.signal(stop, interrupt)
    db = common.jobs_db(args)
    try:
        return follow(db, record.id, strip_ansi=False, exit_with_job=True)
    except KeyboardInterrupt:
        print(
            f"\nmmm-orch: stopping job {record.id} (every rank; a trainer saves first)",
            file=sys.stderr,
        )
    for stop in (signal.SIGINT, *stops):  # the stop runs to its end
        signal.signal(stop, signal.SIG_IGN)
    for line in usecases.cancel(db, [db.get(record.id, events=False)]):
        print(f"mmm-orch: {line}", file=sys.stderr)
    follow(db, record.id, strip_ansi=False, start=following.log_end(record))
    return 130
