"""Refresh job states: one batched scheduler query per (machine, host, scheduler), terminal jobs
never asked again, and an unreachable scheduler turns into stale rows, not an error."""

from __future__ import annotations

import dataclasses
import json
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.hosts import Host, host_for
from mmm_orch.injob import protocol
from mmm_orch.jobs.db import JobDB
from mmm_orch.jobs.record import JobRecord
from mmm_orch.jobs.logs import tail
from mmm_orch.jobs.startup import parse_markers
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.base import JobRef
from mmm_orch.schedulers.states import JobState, JobStatus


@dataclass
class Refresh:
    stale: dict[int, float] = field(default_factory=dict)  # job id -> age of its last known state (s)
    warnings: list[str] = field(default_factory=list)
    removed: set[int] = field(default_factory=set)  # records of submissions that never went through


def refresh(db: JobDB, records: list[JobRecord]) -> Refresh:
    outcome = Refresh()
    settling = [r for r in records if r.state is JobState.SUBMITTING]
    if settling:
        from mmm_orch.jobs.submit import reconcile

        for record in settling:
            try:
                warning = reconcile(db, record)
            except MmmError as exc:
                warning = f"job {record.id}: still submitting ({exc})"
            if warning:
                outcome.warnings.append(warning)
            if db.get(record.id, events=False) is None:
                outcome.removed.add(record.id)
    # One query per scheduler a machine's jobs went to there: its batch jobs and the launches
    # inside its allocations (the local executor) are asked apart.
    groups: dict[tuple[str, str, str], list[JobRecord]] = {}
    for record in records:
        if not record.terminal and record.native_id:
            groups.setdefault((record.machine, record.host, record.scheduler), []).append(record)
    updates: dict[int, JobStatus] = {}
    retired: list[tuple[JobRecord, dict]] = []  # nodes failover retired, to remember as bad
    now = time.time()
    for (machine, host_name, _), group in groups.items():
        newest = max(group, key=lambda r: r.id)
        host = host_for(newest.remote)
        scheduler = scheduler_for(newest.scheduler, newest.commands, host)
        by_native = {r.native_id: r for r in group}
        cancelled = db.cancels_sent([r.id for r in group])
        try:
            statuses = scheduler.query([JobRef(r.native_id, Path(r.job_dir)) for r in group])
            for native_id, status in statuses.items():
                if native_id in by_native:
                    record = by_native[native_id]
                    status = _as_the_job_ended(status, record, host, record.id in cancelled)
                    if record.spares:
                        status, lost = _failover(status, record, host)
                        retired += [(record, entry) for entry in lost]
                    updates[record.id] = status
        except MmmError as exc:
            outcome.warnings.append(
                f"{machine} ({host_name}): scheduler not reachable, showing last known states: {exc}")
            outcome.stale.update({r.id: now - r.checked_at for r in group})
    db.apply(updates, now)
    for record, entry in retired:  # at once, so that the next submission there avoids them
        db.blame_node(record.machine, entry["node"], entry["evidence"], record.id)
    return outcome


# What the job itself wrote at its end overrides a scheduler's plain "completed" or "failed".
def _as_the_job_ended(status: JobStatus, record: JobRecord, host: Host,
                      cancel_sent: bool) -> JobStatus:
    """Read the end of the log of a job that ended: a job the watchdog ended is `hung` (its
    marker says after which step); a job the watchdog stopped before the walltime, having saved,
    is `timeout` and resumable; a job whose script was stopped by SIGTERM was cancelled, even
    where the scheduler records success (a PBS qdel racing the job's end, as seen on the live
    server). So is a job mmm-orch cancelled that the scheduler calls a success without its
    launch having succeeded: after a restart, the live PBS server killed such a job without a
    SIGTERM, recorded exit 0 and left its log empty. A job the scheduler ended at its walltime
    says which checkpoint it can resume from."""
    if status.state not in (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT):
        return status
    raw, _ = tail(host, record.log_path, 60)
    text = raw.decode(errors="replace")
    lines = text.splitlines()
    saved = next((m[1] for line in reversed(lines) if (m := protocol.SAVED.match(line))), None)
    for line in reversed(lines):
        if status.state is JobState.TIMEOUT:
            break
        if protocol.HUNG in line and status.exit_code == protocol.EXIT_HUNG:
            reason = line.split(protocol.HUNG, 1)[1].split("; stopping")[0].strip()
            return dataclasses.replace(status, state=JobState.HUNG, reason=reason)
        if protocol.CHECKPOINTED in line and status.exit_code == protocol.EXIT_CHECKPOINTED:
            return dataclasses.replace(status, state=JobState.TIMEOUT,
                                       reason=f"resumable at step {saved} (saved before the walltime)")
        if protocol.CHAIN in line and protocol.CHAIN_SKIPPED in line:
            return dataclasses.replace(status, state=JobState.CANCELLED, exit_code=None,
                                       reason=line.split(protocol.CHAIN, 1)[1].strip())
        if line.startswith(protocol.STOPPED):
            return dataclasses.replace(status, state=JobState.CANCELLED, exit_code=None,
                                       reason=status.reason or "stopped by SIGTERM")
    if status.state is JobState.TIMEOUT:
        return dataclasses.replace(status, reason=f"resumable at step {saved}" if saved
                                   else "no checkpoint: it cannot be resumed")
    markers = parse_markers(text)
    if status.state is JobState.COMPLETED and markers.launch_exit != 0:
        if cancel_sent:
            return dataclasses.replace(status, state=JobState.CANCELLED, exit_code=None,
                                       reason="cancelled; the scheduler recorded a success, "
                                       "but the launch never finished")
        if markers.launch_start is not None or _launched(host, record):  # and never ended: the script cannot have exited 0 itself
            return dataclasses.replace(status, state=JobState.CANCELLED, exit_code=None,
                                       reason="ended from outside while its launch ran (a qdel "
                                       "racing the job's end); the scheduler recorded a success")
    return status


def _launched(host: Host, record: JobRecord) -> bool:
    """The job script printed its launch's start (near the top of its log): one of our scripts,
    which always prints the launch's end before it exits by itself."""
    from mmm_orch.jobs.logs import head_and_tail

    head = head_and_tail(host, record.log_path, head=1 << 16, last=0) or ""
    return parse_markers(head).launch_start is not None


def _failover(status: JobStatus, record: JobRecord, host: Host) -> tuple[JobStatus, list[dict]]:
    """Where a job with spare nodes stands (failover.json beside it): its attempt, its active
    and spare nodes, the nodes it retired and, once it ended, why its last attempt stopped; and
    the nodes it retired on evidence (a blind rotation is a guess, not evidence)."""
    try:
        text = host.read_from(posixpath.join(record.job_dir, protocol.FAILOVER_FILE), 0)
    except (MmmError, OSError):
        return status, []
    if not text:  # not written yet (the loop writes it once it has picked the active nodes)
        return status, []
    try:  # written by the job: what is not as the loop writes it is said, never a crash
        state = json.loads(text)
        retired = state.get("retired", [])
        lost = [entry for entry in retired if not entry["blind"]]
        return _failover_status(status, state, retired), lost
    except (ValueError, RecursionError, TypeError, KeyError, AttributeError):
        damaged = (f"{protocol.FAILOVER_FILE} is not as the job writes it (truncated or changed): "
                   "its attempts are not shown")
        return dataclasses.replace(status, reason="; ".join(
            [status.reason, damaged]).strip("; ")), []


def _failover_status(status: JobStatus, state: dict, retired: list[dict]) -> JobStatus:
    parts = [f"attempt {state['attempt']}/{state['attempts']}"]
    if retired:
        parts.append(", ".join(f"{entry['node']} retired{' (blind)' if entry['blind'] else ''}"
                               for entry in retired) + f" ({retired[-1]['evidence'][:80]})")
    if status.state is JobState.RUNNING:
        parts.append(f"active {','.join(state['active'])}, spare {','.join(state['spares']) or 'none'}")
        return dataclasses.replace(status, reason="; ".join(parts))
    # Ended outside the loop's view (killed), or in a state whose own words say more (resumable
    # at step N, hung after step N, cancelled): those first.
    if "verdict" not in state or status.state in (JobState.TIMEOUT, JobState.HUNG, JobState.CANCELLED):
        return dataclasses.replace(status, reason="; ".join([status.reason, *parts]).strip("; "))
    if state["verdict"] != "success":
        parts.append(f"{state['verdict']}: {state['reason'][:120]}")
    return dataclasses.replace(status, reason="; ".join(parts))
