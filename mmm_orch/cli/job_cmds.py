"""Commands about jobs: submit, status, logs, cancel."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from mmm_orch.cli import common
from mmm_orch.cli.sweep_cmds import sweep_id
from mmm_orch.errors import MmmError, one_line


def register(sub) -> None:
    p = sub.add_parser("submit", help="submit a job (with --dry-run: print its script only)")
    common.plan_options(p)
    common.plan_option(p, "workdir")
    p.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    common.env_check_option(p)
    p.add_argument(
        "--chain",
        type=common.links,
        metavar="N",
        help="carry the run across up to N jobs, each waiting for the one before and "
        "resuming from its checkpoint, until the training is done",
    )
    common.backlog_option(p)
    p.add_argument(
        "--into",
        type=common.job_id,
        metavar="ID",
        help="run it in held allocation ID (`mmm-orch allocate` prints it) when it has room",
    )
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then stream the log until the job ends; exit with the job's exit code",
    )
    p.add_argument("--json", action="store_true", help="print the job record as JSON")
    p.add_argument(
        "--host",
        metavar="HOST",
        help="submit through this login host over SSH ([user@]host[:port] or a "
        "~/.ssh/config alias; default: here when the scheduler is on PATH, else "
        "the profile's first login host)",
    )
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "rerun",
        help="submit a job's recorded plan again, as a new job linked "
        "to it (same machine, environment and run directory)",
    )
    p.add_argument("job", type=common.job_id, metavar="JOB")
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--resume",
        action="store_const",
        const=True,
        help="continue from the run's latest checkpoint (by default, as the way the job ended "
        "calls for: `mmm-orch status JOB` says how, docs/reference/exit-codes.md what a rerun "
        "does after each)",
    )
    how.add_argument(
        "--fresh",
        action="store_const",
        const=False,
        dest="resume",
        help="start the run again from the beginning",
    )
    p.add_argument("--json", action="store_true", help="print the new job's record as JSON")
    p.set_defaults(func=cmd_rerun)

    p = sub.add_parser("status", help="states of submitted jobs (refreshed from the schedulers)")
    p.add_argument("jobs", nargs="*", type=common.job_id, metavar="JOB")
    p.add_argument("-a", "--all", action="store_true", help="every job, not only open and recent")
    p.add_argument("-m", "--machine", help="only jobs on this machine")
    p.add_argument("-w", "--watch", action="store_true", help="refresh until every job is terminal")
    p.add_argument(
        "--interval",
        type=common.seconds,
        default=5.0,
        help="seconds between --watch refreshes (default 5)",
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="every link of a chain on its own line (default: a chain is one line)",
    )
    p.add_argument(
        "--sweep",
        type=sweep_id,
        metavar="ID",
        help="the points of this sweep, one line each (default: a sweep is one line)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "backlog",
        help="the runs waiting in the backlog (--backlog), submitted now as their queues' job "
        "limits admit them",
    )
    p.add_argument(
        "--every",
        type=common.seconds,
        metavar="SECONDS",
        help="keep moving it every SECONDS while runs wait (a mover on a login node)",
    )
    p.add_argument(
        "--for",
        dest="lasting",
        type=common.seconds,
        metavar="SECONDS",
        help="with --every: stop after this long even if runs still wait",
    )
    p.add_argument("--json", action="store_true", help="the waiting runs' records as JSON")
    p.set_defaults(func=cmd_backlog)

    p = sub.add_parser("logs", help="print or follow a job's log")
    p.add_argument("job", type=common.job_id, metavar="JOB")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="wait while queued, stream while running, stop when the job ends",
    )
    p.add_argument("-n", "--tail", type=common.lines, metavar="N", help="only the last N lines")
    p.add_argument("--strip-ansi", action="store_true", help="remove colour/escape codes")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel jobs (a link of a chain: the chain)")
    p.add_argument("jobs", nargs="*", type=common.job_id, metavar="JOB")
    p.add_argument("--sweep", type=sweep_id, metavar="ID", help="every job of this sweep")
    p.set_defaults(func=cmd_cancel)


def cmd_submit(args: argparse.Namespace) -> int:
    from mmm_orch import usecases

    if args.into is not None:
        return submit_into(args)
    if args.dry_run:
        request = common.request(args)
        if args.backlog:  # its runs wait for room: the queue's jobs are not counted
            request = dataclasses.replace(request, queue_load=usecases.NOTHING_YET)
        planned = usecases.plan(request, args.db)
        usecases.within_budgets(
            planned, args.db, "a chain's first link" if args.chain else "this job"
        )
        return dry_run(planned, args)
    prepared = usecases.prepare(
        common.request(args),
        args.db,
        args.template,
        args.host,
        env_check=not args.no_env_check,
        chain=args.chain or 0,
        backlog=args.backlog,
    )
    if args.chain:
        return submit_chain(prepared, args)
    record = usecases.submit(prepared, args.db, backlog=args.backlog)
    common.tell(prepared.notes)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
    else:
        print(submitted(record))
        print(f"log: {record.log_path}" + (f" (on {record.remote})" if record.remote else ""))
    if args.follow:
        return follow(common.jobs_db(args), record.id, strip_ansi=False, exit_with_job=True)
    return 0


def submit_into(args: argparse.Namespace) -> int:
    """`submit --into ID`: the run recorded waiting in a held allocation, which starts it."""
    from mmm_orch.usecases import allocations, render

    for given, flag in (
        (args.chain, "--chain"),
        (args.backlog, "--backlog"),
        (args.host, "--host"),
    ):
        if given:
            raise MmmError(
                f"{flag} is not for --into: the run goes into allocation {args.into}, which "
                "runs it on its own nodes"
            )
    prepared, allocation = allocations.prepare_run(
        common.request(args), args.into, args.db, args.template, not args.no_env_check
    )
    if args.dry_run:
        common.print_script(render(prepared.plan, prepared.template))
        return 0
    record = allocations.send(prepared, allocation, args.db)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
    else:
        print(f"job {record.id}: {record.workload} on {record.machine}, {record.reason}")
        print(f"log: {record.log_path}")
    if args.follow:
        return follow(common.jobs_db(args), record.id, strip_ansi=False, exit_with_job=True)
    return 0


def submitted(record) -> str:
    """One line: the job submitted, or waiting in the backlog and why."""
    what = f"job {record.id}: {record.workload} on {record.machine}"
    if record.native_id:
        return f"submitted {what}, {record.scheduler} id {record.native_id}"
    return f"{what} {record.reason or 'waiting in the backlog'}; `mmm-orch backlog` moves it"


def cmd_backlog(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import backlogs

    db = common.jobs_db(args)
    if args.lasting is not None and args.every is None:
        raise MmmError("--for is only for --every: how long to keep moving the backlog")
    for moved in backlogs.moving(db, args.every, args.lasting):  # as it goes
        for record in moved.submitted:
            print(submitted(record), flush=True)
        for note in moved.notes:
            print(f"mmm-orch: {one_line(note)}", file=sys.stderr, flush=True)
    waiting = backlogs.waiting(db)
    if args.json:
        print(json.dumps([r.to_dict() for r in waiting], indent=2))
    elif waiting:
        for record in waiting:
            print(f"job {record.id}: {record.workload} on {record.machine}, {record.reason}")
    else:
        print("the backlog is empty")
    return 0


def dry_run(plan, args: argparse.Namespace) -> int:
    """The script that would be submitted; with --chain, the first link's, and what the next
    links change."""
    from mmm_orch.usecases import chain_links, render

    if not args.chain:
        common.print_script(render(plan, args.template))
        return 0
    first, *rest = chain_links(plan, args.chain)
    script = render(first, args.template)
    common.print_script(script)
    if rest:
        second = render(rest[0].waiting_for("<id of link 1>"), args.template)
        lines = set(script.splitlines())
        changed = [line for line in second.splitlines() if line not in lines]
        print(
            f"\n# Links 2-{args.chain} differ only in these lines (each waits for the one before):"
        )
        for line in changed:
            print(f"#   {line}")
    return 0


def submit_chain(prepared, args: argparse.Namespace) -> int:
    from mmm_orch import usecases

    records = usecases.submit_chain(prepared, args.chain, args.db, backlog=args.backlog)
    common.tell(prepared.notes)
    remote = prepared.remote
    if args.json:
        print(json.dumps([r.to_dict() for r in records], indent=2))
        return 0
    if args.backlog:
        sent = [r for r in records if r.native_id]
        print(
            f"chain {records[0].group_id}: {len(records)} links, jobs {records[0].id}-"
            f"{records[-1].id}, in the backlog: each is submitted once the one before ended "
            f"and the queue has room ({len(sent)} submitted now)"
        )
    else:
        print(
            f"chain {records[0].group_id}: {len(records)} links submitted, jobs "
            f"{records[0].id}-{records[-1].id} ({records[0].scheduler} ids "
            f"{records[0].native_id}-{records[-1].native_id}), one after the other"
        )
    print(f"run: {records[0].run_dir}")
    print(f"log of link 1: {records[0].log_path}" + (f" (on {remote})" if remote else ""))
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import PACK_INDEX
    from mmm_orch.usecases.reruns import rerun

    old = common.job(common.jobs_db(args), args.job)
    record = rerun(old, args.resume, args.db)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
        return 0
    packed = record.group_id is not None and record.group_index == PACK_INDEX
    resumed = (
        bool(args.resume)
        if packed  # (a pack's points each resume, or not, in the pack's own plan)
        else record.plan.get("launch", {}).get("args", {}).get("resume") is True
    )
    avoided = sorted(
        set(record.plan.get("placement", {}).get("avoid_nodes", ()))
        - set(old.plan.get("placement", {}).get("avoid_nodes", ()))
    )
    print(
        f"submitted job {record.id}: rerun of job {old.id}"
        + (f" ({old.end_class})" if old.end_class else "")
        + (", resuming from its run's latest checkpoint" if resumed else ", from the start")
        + (f", avoiding {','.join(avoided)}" if avoided else "")
        + f", {record.scheduler} id {record.native_id}"
    )
    print(f"log: {record.log_path}" + (f" (on {record.remote})" if record.remote else ""))
    if packed:
        print(f"its points: mmm-orch status --sweep {record.group_id}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from mmm_orch.cli import view
    from mmm_orch.usecases import following

    db = following.open_jobs(args.db)
    asked = dict(
        ids=args.jobs, machine=args.machine, all_jobs=args.all, sweep=args.sweep, links=args.links
    )
    shown = (
        following.watch(db, args.interval, **asked)
        if args.watch
        else iter([following.status(db, **asked)])
    )
    tty = sys.stdout.isatty() and not args.json
    with view.live(args.watch and tty) as live:
        for now in shown:
            for warning in now.refresh.warnings:  # (they quote the schedulers' words)
                print(f"mmm-orch: warning: {one_line(warning)}", file=sys.stderr)
            if args.json:
                print(view.json_rows(now.records, now.refresh))
            else:
                live(view.table(view.rows(now.lines, now.refresh), tty=tty))
    return 0


def follow(db, job_id: int, strip_ansi: bool, exit_with_job: bool = False, start: int = 0) -> int:
    from mmm_orch.cli import view
    from mmm_orch.usecases import following

    def waiting(path: str) -> None:
        print(f"mmm-orch: waiting for job {job_id} to start writing {path}", file=sys.stderr)

    for text in following.follow(db, job_id, strip_ansi, start, waiting):
        view.write(text)
    if not exit_with_job:
        return 0
    final = following.job(db, job_id)
    print(
        f"mmm-orch: job {job_id} {final.state.value} (exit {view.exit_text(final)})",
        file=sys.stderr,
    )
    if final.exit_code is not None:
        return final.exit_code
    return 0 if final.state.value == "completed" else 1


def cmd_logs(args: argparse.Namespace) -> int:
    from mmm_orch.cli import view
    from mmm_orch.usecases import following, inspection

    db = following.open_jobs(args.db)
    record = following.job(db, args.job)
    text, start = inspection.log_text(record, args.tail, args.strip_ansi)
    if text is not None:
        view.write(text)
    elif not args.follow:
        raise MmmError(
            f"job {args.job} has no log yet ({record.state.value}): {record.log_path}; "
            "use --follow to wait for it"
        )
    if args.follow:
        return follow(db, args.job, args.strip_ansi, start=start)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from mmm_orch import usecases

    db = common.jobs_db(args)
    if not args.jobs and args.sweep is None:
        raise MmmError("cancel: name the jobs (JOB...) or a sweep (--sweep ID)")
    records = [common.job(db, job_id) for job_id in args.jobs]
    for outcome in usecases.cancel(db, records, args.sweep):
        print(outcome)
    return 0
