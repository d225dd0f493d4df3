"""The mmm-orch command line. Heavy modules (pydantic, jinja2, rich) load only where needed."""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--db", metavar="PATH",
                        help="job database (default: $MMM_ORCH_DB or $XDG_STATE_HOME/mmm-orch/jobs.db)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("machines", help="list machine profiles")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("workloads", help="list workload specs")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("show", help="show a job (script, plan, history), a machine profile or a "
                       "workload spec", usage="mmm-orch show JOB | machine NAME | workload NAME")
    p.add_argument("what", metavar="JOB|machine|workload")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("schema", help="JSON Schema of machine profiles or workload specs")
    p.add_argument("kind", choices=["machine", "workload"])

    p = sub.add_parser("render", help="print the job script for a machine and workload")
    _plan_options(p)
    p.add_argument("-o", "--out", help="write the script to this file instead of stdout")
    p = sub.add_parser("submit", help="submit a job (with --dry-run: print its script only)")
    _plan_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then stream the log until the job ends; exit with the job's exit code")
    p.add_argument("--json", action="store_true", help="print the job record as JSON")
    p.add_argument("--host", metavar="HOST",
                   help="submit through this login host over SSH ([user@]host[:port] or a "
                        "~/.ssh/config alias; default: here when the scheduler is on PATH, else "
                        "the profile's first login host)")

    p = sub.add_parser("status", help="states of submitted jobs (refreshed from the schedulers)")
    p.add_argument("jobs", nargs="*", type=int, metavar="JOB")
    p.add_argument("-a", "--all", action="store_true", help="every job, not only open and recent")
    p.add_argument("-m", "--machine", help="only jobs on this machine")
    p.add_argument("-w", "--watch", action="store_true", help="refresh until every job is terminal")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between --watch refreshes")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("logs", help="print or follow a job's log")
    p.add_argument("job", type=int, metavar="JOB")
    p.add_argument("-f", "--follow", action="store_true",
                   help="wait while queued, stream while running, stop when the job ends")
    p.add_argument("-n", "--tail", type=int, metavar="N", help="only the last N lines")
    p.add_argument("--strip-ansi", action="store_true", help="remove colour/escape codes")

    p = sub.add_parser("cancel", help="cancel jobs")
    p.add_argument("jobs", nargs="+", type=int, metavar="JOB")

    p = sub.add_parser("diagnose", help="why a job failed: the first real failure in its log, "
                       "the node, and the documented fix")
    p.add_argument("job", type=int, nargs="?", metavar="JOB")
    p.add_argument("--log", metavar="FILE", help="diagnose this log file instead of a recorded job")
    p.add_argument("-m", "--machine", help="with --log: the machine, for its own failure signatures")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("timeline", help="a job's submit, queue wait, start, launch, first step "
                       "and end, each with the gap to the one before")
    p.add_argument("job", type=int, metavar="JOB")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("startup", help="start-to-first-step times across recorded runs (or log "
                       "files), with median and worst per group")
    p.add_argument("-m", "--machine", help="only jobs on this machine")
    p.add_argument("-w", "--workload", help="only jobs of this workload")
    p.add_argument("--log", dest="logs", nargs="+", action="extend", default=[], metavar="FILE",
                   help="read these log files (any job's, with `Job started at:` and step lines) "
                        "instead of recorded jobs")
    p.add_argument("--json", action="store_true")
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
    if args.dry_run:
        _print_script(_script(args))
        return 0
    from mmm_orch.jobs.db import JobDB, db_path
    from mmm_orch.jobs.submit import submit
    from mmm_orch.plan import resolve

    from mmm_orch.jobs.submit import target_for

    plan = resolve(_request(args))
    record = submit(plan, db_path(args.db), args.template, remote=target_for(plan, args.host))
    db = JobDB(db_path(args.db))
    if args.json:
        print(json.dumps(record.to_dict(), indent=2))
    else:
        print(f"submitted job {record.id}: {record.workload} on {record.machine}, "
              f"{record.scheduler} id {record.native_id}")
        print(f"log: {record.log_path}" + (f" (on {record.remote})" if record.remote else ""))
    if args.follow:
        return _follow(db, record.id, strip_ansi=False, exit_with_job=True)
    return 0


def _job(db, job_id: int):
    record = db.get(job_id)
    if record is None:
        last = db.count()
        raise MmmError(f"job {job_id} not found in {db.path}"
                       + (f"; known ids are 1-{last}" if last else "; no jobs recorded yet"))
    return record


def cmd_status(args: argparse.Namespace) -> int:
    import time

    from mmm_orch.jobs import view
    from mmm_orch.jobs.db import open_db
    from mmm_orch.jobs.track import refresh

    db = open_db(args.db)
    for job_id in args.jobs:
        _job(db, job_id)

    def select():
        """The jobs to show: every open one among them, so one refresh covers them all."""
        if args.jobs or args.all:
            return db.list(ids=args.jobs, machine=args.machine)
        recent = db.list(limit=20, machine=args.machine)
        shown = {r.id for r in recent}
        older = [r for r in db.list(open_only=True, machine=args.machine) if r.id not in shown]
        return older + recent

    tty = sys.stdout.isatty() and not args.json
    live = None
    if args.watch and tty:
        from rich.live import Live

        live = Live(auto_refresh=False)
        live.start()
    try:
        while True:
            records = select()
            outcome = refresh(db, records)
            if open_ids := [r.id for r in records if not r.terminal]:
                fresh = {r.id: r for r in db.list(ids=open_ids)}
                records = [fresh.get(r.id, r) for r in records]
            for warning in outcome.warnings:
                print(f"mmm-orch: warning: {warning}", file=sys.stderr)
            if args.json:
                print(view.json_rows(records, outcome))
            elif live is not None:
                live.update(view.table(records, outcome, tty=True), refresh=True)
            elif tty:
                from rich.console import Console

                Console().print(view.table(records, outcome, tty=True))
            else:
                sys.stdout.write(view.table(records, outcome, tty=False))
                sys.stdout.flush()
            if not args.watch or all(r.terminal for r in records):
                return 0
            time.sleep(args.interval)
    finally:
        if live is not None:
            live.stop()


def _follow(db, job_id: int, strip_ansi: bool, exit_with_job: bool = False,
            start: int = 0) -> int:
    from mmm_orch.hosts import host_for
    from mmm_orch.jobs import logs
    from mmm_orch.jobs.track import refresh

    record = _job(db, job_id)

    def done() -> bool:
        refresh(db, [db.get(job_id, events=False)])
        return db.get(job_id, events=False).terminal

    def waiting() -> None:
        print(f"mmm-orch: waiting for job {job_id} to start writing {record.log_path}",
              file=sys.stderr)

    for chunk in logs.follow(host_for(record.remote), record.log_path, done, start=start,
                             on_wait=waiting):
        logs.write(logs.clean(chunk, strip_ansi))
    final = db.get(job_id, events=False)
    if not exit_with_job:
        return 0
    from mmm_orch.jobs.view import exit_text

    print(f"mmm-orch: job {job_id} {final.state.value} (exit {exit_text(final)})", file=sys.stderr)
    if final.exit_code is not None:
        return final.exit_code
    return 0 if final.state.value == "completed" else 1


def cmd_logs(args: argparse.Namespace) -> int:
    from mmm_orch.hosts import host_for
    from mmm_orch.jobs import logs
    from mmm_orch.jobs.db import open_db

    db = open_db(args.db)
    record = _job(db, args.job)
    host = host_for(record.remote)
    start = host.size(record.log_path)
    if start is not None:
        if args.tail is not None:
            text, start = logs.tail(host, record.log_path, args.tail)
        else:
            text = host.read_from(record.log_path, 0, start) or b""
        logs.write(logs.clean(text, args.strip_ansi))
    elif not args.follow:
        raise MmmError(f"job {args.job} has no log yet ({record.state.value}): {record.log_path}; "
                       "use --follow to wait for it")
    if args.follow:
        return _follow(db, args.job, args.strip_ansi, start=start or 0)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmm_orch.hosts import host_for
    from mmm_orch.jobs.db import open_db
    from mmm_orch.jobs.track import refresh
    from mmm_orch.schedulers.base import JobRef, scheduler_for

    db = open_db(args.db)
    records = [_job(db, job_id) for job_id in args.jobs]
    refresh(db, records)
    for record in records:
        record = db.get(record.id, events=False)
        if record.terminal:
            print(f"job {record.id} already {record.state.value}")
            continue
        scheduler = scheduler_for(record.scheduler, record.commands, host_for(record.remote))
        scheduler.cancel(JobRef(record.native_id, Path(record.job_dir)))
        refresh(db, [record])
        now = db.get(record.id, events=False)
        print(f"job {record.id}: cancel sent ({record.scheduler} id {record.native_id}); "
              f"state {now.state.value}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from mmm_orch import console

    rows = console.machine_rows() if args.command == "machines" else console.workload_rows()
    console.print_rows(rows, as_json=args.json, title=args.command)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if args.what.isdigit() and args.name is None:
        from mmm_orch.jobs import view
        from mmm_orch.jobs.db import open_db

        record = _job(open_db(args.db), int(args.what))
        print(view.details_json(record) if args.json else view.details(record))
        return 0
    if args.what not in ("machine", "workload") or not args.name:
        raise MmmError(f"show {args.what!r}: expected a job id, 'machine NAME' or 'workload NAME'")
    from mmm_orch import console
    from mmm_orch.config.registry import load_machine, load_workload

    obj = load_machine(args.name) if args.what == "machine" else load_workload(args.name)
    console.print_model(obj, as_json=args.json)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from mmm_orch.config.yamlio import adapter

    if args.kind == "machine":
        from mmm_orch.config.machine import Machine as cls
    else:
        from mmm_orch.config.workload import Workload as cls
    print(json.dumps(adapter(cls).json_schema(), indent=2))
    return 0


def _stamp(at: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def cmd_timeline(args: argparse.Namespace) -> int:
    from mmm_orch.hosts import host_for
    from mmm_orch.jobs import logs, startup
    from mmm_orch.jobs.db import open_db
    from mmm_orch.jobs.track import refresh

    db = open_db(args.db)
    record = _job(db, args.job)
    refresh(db, [record])
    record = _job(db, args.job)
    text = logs.head_and_tail(host_for(record.remote), record.log_path) or ""
    markers = startup.parse_markers(text)
    rows = startup.timeline(record.submitted_at, markers, record.ended_at)
    if args.json:
        print(json.dumps({"job": record.id, "state": record.state.value, "events": rows,
                          "startup_s": markers.startup_s}, indent=2))
        return 0
    print(f"job {record.id}: {record.workload} on {record.machine}, {record.nodes} node(s), "
          f"{record.ranks} ranks, {record.state.value}")
    for row in rows:
        gap = "" if row["gap_s"] is None else f"+{row['gap_s']:.1f}s"
        print(f"  {row['event']:<13} {_stamp(row['at'])}  {gap}")
    if markers.startup_s is not None:
        print(f"  startup (job start to first step): {markers.startup_s:.1f}s")
    elif not text:
        print(f"  no log yet: {record.log_path}")
    return 0


def cmd_startup(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmm_orch.jobs import startup

    rows = []
    if args.logs:
        for name in args.logs:
            path = Path(name)
            if not path.is_file():
                raise MmmError(f"--log {name!r}: no such file")
            markers = startup.from_file_name(
                path.name, startup.parse_markers(path.read_text(errors="replace")))
            rows.append({"log": path.name, "machine": "", "workload": "", "nodes": markers.nodes,
                         "ranks": markers.ranks, "host": markers.host, "start": markers.job_start,
                         "first_step": markers.first_step, "startup_s": markers.startup_s})
    else:
        from mmm_orch.hosts import host_for
        from mmm_orch.jobs import logs
        from mmm_orch.jobs.db import open_db

        for record in open_db(args.db).list(machine=args.machine):
            if args.workload and record.workload != args.workload:
                continue
            text = logs.head_and_tail(host_for(record.remote), record.log_path)
            markers = startup.parse_markers(text or "")
            rows.append({"job": record.id, "machine": record.machine, "workload": record.workload,
                         "nodes": record.nodes, "ranks": record.ranks, "host": markers.host,
                         "start": markers.job_start, "first_step": markers.first_step,
                         "startup_s": markers.startup_s})
    groups = startup.summarize(rows, ("machine", "workload", "nodes", "ranks"))
    if args.json:
        print(json.dumps({"runs": rows, "groups": groups}, indent=2))
        return 0
    if not rows:
        print("no runs recorded" + (" for that selection" if args.machine or args.workload else ""))
        return 0
    label = "log" if args.logs else "job"
    # Recorded jobs carry epoch seconds; other logs carry their node's wall clock, kept as is.
    show = _utc if args.logs else _stamp
    width = max(len(label), *(len(str(row[label])) for row in rows))
    print(f"{label:<{width}} {'workload':<12} {'nodes':>5} {'ranks':>5}  {'start':<19}  "
          f"{'first step':<19} {'seconds':>8}")
    for row in rows:
        start, first = (("-" if row[k] is None else show(row[k])) for k in ("start", "first_step"))
        seconds = "-" if row["startup_s"] is None else f"{row['startup_s']:.1f}"
        print(f"{str(row[label]):<{width}} {row['workload'] or '-':<12} {row['nodes'] or '-':>5} "
              f"{row['ranks'] or '-':>5}  {start:<19}  {first:<19} {seconds:>8}")
    for group in groups:
        print(f"{group['machine'] or 'logs'} {group['workload'] or ''} nodes={group['nodes']} "
              f"ranks={group['ranks']}: {group['runs']} run(s), median {group['median_s']:.1f}s, "
              f"worst {group['worst_s']:.1f}s")
    missing = sum(1 for r in rows if r["startup_s"] is None)
    if missing:
        print(f"{missing} run(s) without a first step (still starting, failed early, or no markers)")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmm_orch.config.registry import load_machine
    from mmm_orch.jobs import diagnose

    if (args.job is None) == (args.log is None):
        raise MmmError("diagnose: give a job id or --log FILE (not both)")
    if args.log:
        path = Path(args.log)
        if not path.is_file():
            raise MmmError(f"--log {args.log!r}: no such file")
        text, machine, where, header = path.read_text(errors="replace"), args.machine, str(path), path.name
    else:
        from mmm_orch.hosts import host_for
        from mmm_orch.jobs import logs
        from mmm_orch.jobs.db import open_db
        from mmm_orch.jobs.track import refresh
        from mmm_orch.jobs.view import exit_text

        db = open_db(args.db)
        refresh(db, [_job(db, args.job)])
        record = _job(db, args.job)
        log = logs.head_and_tail(host_for(record.remote), record.log_path, head=256 << 20,
                                 last=16 << 20)
        if log is None:
            raise MmmError(f"job {record.id} has no log yet ({record.state.value}): {record.log_path}")
        # The scheduler's own word (a PBS comment, a Slurm reason) can be the whole story.
        text = log + (f"\nscheduler: {record.reason}\n" if record.reason else "")
        machine, where = record.machine, record.log_path
        header = (f"job {record.id}: {record.workload} on {record.machine}, {record.state.value}, "
                  f"exit {exit_text(record)}")
    signatures = (load_machine(machine).failures if machine else []) + diagnose.generic_signatures()
    result = diagnose.diagnose(text, signatures)
    if args.json:
        print(json.dumps({"log": where, **result.to_dict()}, indent=2))
        return 0
    print(header)
    first = result.first
    if first is None:
        print("no known failure signature in the log" + (f" ({result.fallout} fallout lines)" if result.fallout else ""))
        return 0
    who = ", ".join(filter(None, [f"rank {first.rank}" if first.rank is not None else "",
                                  f"host {first.host}" if first.host else ""]))
    print(f"first failure: {first.signature.name} at line {first.line_number} of {where}"
          + (f" ({who})" if who else ""))
    print(f"  {first.line}")
    print(f"  what: {first.signature.meaning}")
    print(f"  fix: {first.signature.fix}")
    print(f"  source: {first.signature.source}")
    if result.later:
        print("also seen later: " + ", ".join(f"{name} ({n} lines)" for name, n in result.later.items()))
    if result.fallout:
        print(f"ignored {result.fallout} fallout lines (ranks stopped because of the failure above)")
    return 0


def _utc(seconds: float) -> str:
    """A log-local time kept as seconds since 1970 on that clock (no zone to apply)."""
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


COMMANDS = {
    "machines": cmd_list,
    "workloads": cmd_list,
    "show": cmd_show,
    "schema": cmd_schema,
    "render": cmd_render,
    "submit": cmd_submit,
    "status": cmd_status,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "timeline": cmd_timeline,
    "diagnose": cmd_diagnose,
    "startup": cmd_startup,
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
    finally:
        if "mmm_orch.hosts" in sys.modules:  # one SSH connection per command, closed at its end
            sys.modules["mmm_orch.hosts"].close_all()
