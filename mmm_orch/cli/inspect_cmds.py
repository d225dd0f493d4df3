"""Commands that look inside jobs: timeline, startup, diagnose."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mmm_orch.cli import common
from mmm_orch.errors import MmmError, one_line


def register(sub) -> None:
    p = sub.add_parser(
        "diagnose",
        help="why a job failed: the first real failure in its log, "
        "the node, and the documented fix",
    )
    p.add_argument("job", type=common.job_id, nargs="?", metavar="JOB")
    p.add_argument("--log", metavar="FILE", help="diagnose this log file instead of a recorded job")
    p.add_argument(
        "-m", "--machine", help="with --log: the machine, for its own failure signatures"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diagnose)
    p = sub.add_parser(
        "timeline",
        help="a job's submit, queue wait, start, launch, first step "
        "and end, each with the gap to the one before",
    )
    p.add_argument("job", type=common.job_id, metavar="JOB")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_timeline)
    p = sub.add_parser(
        "startup",
        help="start-to-first-step times across recorded runs (or log "
        "files), with median and worst per group",
    )
    p.add_argument("-m", "--machine", help="only jobs on this machine")
    p.add_argument("-w", "--workload", help="only jobs of this workload")
    p.add_argument(
        "--log",
        dest="logs",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="read these log files (any job's, with `Job started at:` and step lines) "
        "instead of recorded jobs",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_startup)
    p = sub.add_parser(
        "profile",
        help="where the step time went in a profiled run: data, forward, backward, optimizer, "
        "exposed communication and idle per step, the top operators, the slowest rank",
    )
    p.add_argument("target", metavar="JOB|RUN_DIR", help="a job's id or a run directory")
    p.add_argument("--rank", type=int, metavar="R", help="only this rank's trace")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profile)


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def cmd_timeline(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import following, inspection

    db = following.open_jobs(args.db)
    record = following.job(db, args.job)
    assert db is not None  # following.job found the record in it
    found = inspection.timeline(db, record)
    record = found.record
    if args.json:
        print(
            json.dumps(
                {
                    "job": record.id,
                    "state": record.state.value,
                    "events": found.events,
                    "startup_s": found.startup_s,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"job {record.id}: {record.workload} on {record.machine}, {record.nodes} node(s), "
        f"{record.ranks} ranks, {record.state.value}"
    )
    width = max((len(row["event"]) for row in found.events), default=0)
    for row in found.events:
        gap = "" if row["gap_s"] is None else f"{row['gap_s']:+.1f}s"
        print(f"  {row['event']:<{width}} {_stamp(row['at'])}  {gap}")
    if found.startup_s is not None:
        print(f"  startup (job start to first step): {found.startup_s:.1f}s")
    elif not found.has_log:
        print(f"  no log yet: {record.log_path}")
    elif found.launch_ended and not found.first_step_seen:
        print(f"  no first step: {inspection.NO_STEPS}")
    return 0


def cmd_startup(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import following, inspection

    if args.logs:
        rows, groups = inspection.startup_of_files(args.logs)
    else:
        rows, groups = inspection.startup_of_jobs(
            following.open_jobs(args.db), args.machine, args.workload
        )
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
    print(
        f"{label:<{width}} {'workload':<12} {'nodes':>5} {'ranks':>5}  {'start':<19}  "
        f"{'first step':<19} {'seconds':>8}"
    )
    for row in rows:
        start, first = (("-" if row[k] is None else show(row[k])) for k in ("start", "first_step"))
        seconds = "-" if row["startup_s"] is None else f"{row['startup_s']:.1f}"
        print(
            f"{str(row[label]):<{width}} {row['workload'] or '-':<12} {row['nodes'] or '-':>5} "
            f"{row['ranks'] or '-':>5}  {start:<19}  {first:<19} {seconds:>8}"
        )
    for group in groups:
        print(
            f"{group['machine'] or 'logs'} {group['workload'] or ''} nodes={group['nodes']} "
            f"ranks={group['ranks']}: {group['runs']} run(s), median {group['median_s']:.1f}s, "
            f"worst {group['worst_s']:.1f}s"
        )
    missing = sum(1 for r in rows if r["startup_s"] is None)
    if missing:
        print(
            f"{missing} run(s) without a first step (still starting, failed early, or no markers)"
        )
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from mmm_orch.cli import view
    from mmm_orch.usecases import following, inspection

    if (args.job is None) == (args.log is None):
        raise MmmError("diagnose: give a job id or --log FILE (not both)")
    if args.log:
        result, blamed = inspection.diagnose_file(args.log, args.machine), ""
        machine, where, header = args.machine, args.log, Path(args.log).name
    else:
        db = following.open_jobs(args.db)
        asked = following.job(db, args.job)
        assert db is not None  # following.job found the record in it
        found = inspection.diagnose(db, asked)
        record, result, blamed = found.record, found.result, found.blamed
        machine, where = record.machine, record.log_path
        header = (
            f"job {record.id}: {record.workload} on {record.machine}, {record.state.value}, "
            f"exit {view.exit_text(record)}"
        )
        if found.end is not None:
            header += f"\nended: {one_line(found.end.said)}: {found.end.end_class.what}"
            header += f"\nrerun: {found.rerun_said}"
    if args.json:
        end = found.end.to_dict() if args.log is None and found.end else None
        print(json.dumps({"log": where, "end": end, **result.to_dict()}, indent=2))
        return 0
    print(header)
    first = result.first
    if first is None:
        print(
            "no known failure signature in the log"
            + (f" ({result.fallout} fallout lines)" if result.fallout else "")
        )
        return 0
    who = ", ".join(
        filter(
            None,
            [
                f"rank {first.rank}" if first.rank is not None else "",
                f"host {one_line(first.host)}" if first.host else "",
            ],
        )
    )
    print(
        f"first failure: {first.signature.name} at line {first.line_number} of {where}"
        + (f" ({who})" if who else "")
    )
    print(f"  {one_line(first.line)}")  # the log's or the scheduler's words, escaped
    print(f"  what: {first.signature.meaning}")
    print(
        f"  fix: {first.signature.fix.replace('MACHINE', machine) if machine else first.signature.fix}"
    )
    print(f"  source: {first.signature.source}")
    if blamed:
        print(
            f"remembered {one_line(blamed)} as bad on {machine}: later jobs there avoid it "
            f"(`mmm-orch nodes`; `mmm-orch nodes forget {one_line(blamed)}`)"
        )
    if result.later:
        print(
            "also seen later: "
            + ", ".join(f"{name} ({n} lines)" for name, n in result.later.items())
        )
    if result.fallout:
        print(
            f"ignored {result.fallout} fallout lines (ranks stopped because of the failure above)"
        )
    return 0


def _utc(seconds: float) -> str:
    """A log-local time kept as seconds since 1970 on that clock (no zone to apply)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def cmd_profile(args: argparse.Namespace) -> int:
    from mmm_orch.cli import view
    from mmm_orch.usecases import step_profiles

    db = common.jobs_db(args) if args.target.isdigit() else None
    found = step_profiles.profile(db, args.target, args.rank)
    if args.json:
        print(json.dumps(view.profile_dicts(found), indent=2))
    else:
        print(view.profile_text(found))
    return 0
