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
from mmm_orch.injob import ends, files, protocol
from mmm_orch.injob.diagnose import setup_failure
from mmm_orch.progress.endings import Signatures, end_of
from mmm_orch.progress.logs import head_and_tail, tail
from mmm_orch.progress.startup import parse_markers
from mmm_orch.records.db import JobDB
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.base import JobRef
from mmm_orch.schedulers.states import JobState, JobStatus
from mmm_orch.submission.settle import reconcile


@dataclass
class Refresh:
    """What a refresh found: the records as they are now (in the order asked, less those
    removed), the ones whose state could not be asked, and what to warn about."""

    records: list[JobRecord] = field(default_factory=list)
    stale: dict[int, float] = field(
        default_factory=dict
    )  # job id -> age of its last known state (s)
    warnings: list[str] = field(default_factory=list)
    removed: set[int] = field(default_factory=set)  # records of submissions that never went through


def refresh(db: JobDB, records: list[JobRecord]) -> Refresh:
    outcome = Refresh()
    settling = [r for r in records if r.state is JobState.SUBMITTING]
    if settling:
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
    ended: dict[int, ends.End] = {}
    signatures = Signatures()
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
                    if record.nodes + record.spares > 1:
                        status, left_out = _screened(db, status, record, host)
                        retired += [(record, entry) for entry in left_out]
                        status = _stragglers(status, record, host)
                    if status.state.terminal and status.state is not JobState.NOT_STARTED:
                        end = end_of(
                            record, status.state, status.reason, host, signatures.of(machine)
                        )
                        ended[record.id] = end
                        if end.end_class.avoid_node and end.node:
                            retired.append((record, {"node": end.node, "evidence": end.evidence}))
                    updates[record.id] = status
        except MmmError as exc:
            outcome.warnings.append(
                f"{machine} ({host_name}): scheduler not reachable, showing last known states: {exc}"
            )
            outcome.stale.update({r.id: now - r.checked_at for r in group})
    db.apply(updates, now)
    for job_id, end in ended.items():
        db.ended(job_id, end)
    for record, entry in retired:  # at once, so that the next submission there avoids them
        db.bad_nodes.blame(record.machine, entry["node"], entry["evidence"], record.id)
    changed = [r.id for r in records if not r.terminal and r.id not in outcome.removed]
    fresh = {r.id: r for r in db.list(ids=changed)} if changed else {}  # an ended job stays so
    outcome.records = [fresh.get(r.id, r) for r in records if r.id not in outcome.removed]
    return outcome


# What the job itself wrote at its end overrides a scheduler's plain "completed" or "failed".
def _as_the_job_ended(
    status: JobStatus, record: JobRecord, host: Host, cancel_sent: bool
) -> JobStatus:
    """How a job that ended says it ended: in its outcome file (files.Outcome, written by the
    watchdog, failover or the chain as its launch ended), else (killed before, no watchdog) at
    the end of its log. A job the watchdog ended is `hung` (after which step); a job the watchdog
    stopped before the walltime, having saved, is `timeout` and resumable; a job stopped by
    SIGTERM was cancelled, even where the scheduler records success (a PBS qdel racing the job's
    end, as seen on the live server). So is a job mmm-orch cancelled that the scheduler calls a
    success without its launch having succeeded: after a restart, the live PBS server killed
    such a job without a SIGTERM, recorded exit 0 and left its log empty. A job the scheduler
    ended at its walltime says which checkpoint it can resume from."""
    if status.state not in (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT):
        return status
    text = _job_file(host, record, protocol.OUTCOME_FILE)
    if text is None:
        return _from_the_log(status, record, host, cancel_sent)
    try:  # written by the job: what is not as it writes it is said, and the log read instead
        outcome = files.Outcome.from_json(text)
    except files.ProtocolFileError as exc:
        read = _from_the_log(status, record, host, cancel_sent)
        note = f"{files.unreadable(protocol.OUTCOME_FILE, exc)}: read from the log"
        # The note first: the table shows a note's start, and what follows is the log's word.
        return dataclasses.replace(read, reason="; ".join([note, read.reason]).strip("; "))
    return _from_the_outcome(status, outcome, cancel_sent)


def _from_the_outcome(status: JobStatus, outcome: files.Outcome, cancel_sent: bool) -> JobStatus:
    """_as_the_job_ended from the job's outcome file: what _from_the_log reads from the log's
    markers, said by the program that saw the launch end."""
    saved = outcome.saved_step
    if status.state is JobState.TIMEOUT:
        return dataclasses.replace(
            status,
            reason=f"resumable at step {saved}"
            if saved is not None
            else "no checkpoint: it cannot be resumed",
        )
    if outcome.why == files.WHY_HUNG and status.exit_code == protocol.EXIT_HUNG:
        return dataclasses.replace(status, state=JobState.HUNG, reason=outcome.detail)
    if outcome.why == files.WHY_CHECKPOINTED and status.exit_code == protocol.EXIT_CHECKPOINTED:
        at = f" at step {saved}" if saved is not None else ""
        return dataclasses.replace(
            status, state=JobState.TIMEOUT, reason=f"resumable{at} (saved before the walltime)"
        )
    if outcome.why == files.WHY_CHAIN_SKIPPED:
        return dataclasses.replace(
            status, state=JobState.CANCELLED, exit_code=None, reason=outcome.detail
        )
    if outcome.why == files.WHY_STOPPED:
        return dataclasses.replace(
            status, state=JobState.CANCELLED, exit_code=None, reason=status.reason or outcome.detail
        )
    if outcome.why == files.WHY_SCREENED_OUT:  # nothing trained: the figures say why
        return dataclasses.replace(status, state=JobState.FAILED, reason=outcome.detail)
    if status.state is JobState.COMPLETED and outcome.exit_code != 0:  # the script exits with it
        return dataclasses.replace(
            status,
            state=JobState.CANCELLED,
            exit_code=None,
            reason=(
                "cancelled; the scheduler recorded a success, but the launch did not succeed"
                if cancel_sent
                else f"ended from outside after its launch exited "
                f"{outcome.exit_code}; the scheduler recorded a success"
            ),
        )
    return status


def _from_the_log(status: JobStatus, record: JobRecord, host: Host, cancel_sent: bool) -> JobStatus:
    """_as_the_job_ended from the last lines of the log: a job without an outcome file."""
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
            return dataclasses.replace(
                status,
                state=JobState.TIMEOUT,
                reason=f"resumable at step {saved} (saved before the walltime)",
            )
        if protocol.CHAIN in line and protocol.CHAIN_SKIPPED in line:
            return dataclasses.replace(
                status,
                state=JobState.CANCELLED,
                exit_code=None,
                reason=line.split(protocol.CHAIN, 1)[1].strip(),
            )
        if line.startswith(protocol.STOPPED):
            return dataclasses.replace(
                status,
                state=JobState.CANCELLED,
                exit_code=None,
                reason=status.reason or "stopped by SIGTERM",
            )
    if status.state is JobState.TIMEOUT:
        return dataclasses.replace(
            status,
            reason=f"resumable at step {saved}" if saved else "no checkpoint: it cannot be resumed",
        )
    if status.state is JobState.FAILED and (setup := setup_failure(text, record.machine)):
        return dataclasses.replace(status, reason=setup)  # the job stopped at its setup
    markers = parse_markers(text)
    if status.state is JobState.COMPLETED and markers.launch_exit != 0:
        if cancel_sent:
            return dataclasses.replace(
                status,
                state=JobState.CANCELLED,
                exit_code=None,
                reason="cancelled; the scheduler recorded a success, but the launch never finished",
            )
        if markers.launch_start is not None or _launched(
            host, record
        ):  # and never ended: the script cannot have exited 0 itself
            return dataclasses.replace(
                status,
                state=JobState.CANCELLED,
                exit_code=None,
                reason="ended from outside while its launch ran (a qdel "
                "racing the job's end); the scheduler recorded a success",
            )
    return status


def _launched(host: Host, record: JobRecord) -> bool:
    """The job script printed its launch's start (near the top of its log): one of our scripts,
    which always prints the launch's end before it exits by itself."""
    head = head_and_tail(host, record.log_path, head=1 << 16, last=0) or ""
    return parse_markers(head).launch_start is not None


def _job_file(host: Host, record: JobRecord, name: str) -> bytes | None:
    """File `name` of the job's directory (at most read_from's MiB: the jobs write a few hundred
    bytes); None where there is none to read."""
    try:
        return host.read_from(posixpath.join(record.job_dir, name), 0)
    except (MmmError, OSError):
        return None


def _noted(status: JobStatus, note: str) -> JobStatus:
    return dataclasses.replace(status, reason="; ".join([status.reason, note]).strip("; "))


def _failover(status: JobStatus, record: JobRecord, host: Host) -> tuple[JobStatus, list[dict]]:
    """Where a job with spare nodes stands (failover.json beside it): its attempt, its active
    and spare nodes, the nodes it retired and, once it ended, why its last attempt stopped; and
    the nodes it retired on evidence (a blind rotation is a guess, not evidence)."""
    text = _job_file(host, record, protocol.FAILOVER_FILE)
    if not text:  # not written yet (the loop writes it once it has picked the active nodes)
        return status, []
    try:  # written by the job: what is not as the loop writes it is said, never a crash
        state = files.FailoverState.from_json(text)
    except files.ProtocolFileError as exc:
        note = f"{files.unreadable(protocol.FAILOVER_FILE, exc)}: its attempts are not shown"
        return _noted(status, note), []
    lost = [
        {"node": entry.node, "evidence": entry.evidence}
        for entry in state.retired
        if not entry.blind
    ]
    return _failover_status(status, state), lost


def _screened(
    db: JobDB, status: JobStatus, record: JobRecord, host: Host
) -> tuple[JobStatus, list[dict]]:
    """The screen before the job's launch (SCREEN_FILE beside it), kept in its record the first
    time it is read, with the nodes it left out then (the bad-node memory's evidence, with their
    figures); its verdict said in the job's reason whenever it left a node out."""
    if record.screen is not None:
        text: bytes | None = json.dumps(record.screen).encode()
    elif status.state is JobState.PENDING:
        return status, []
    else:
        text = _job_file(host, record, protocol.SCREEN_FILE)
    if not text:  # none (screen off, one node, an older mmm-orch) or not written yet
        return status, []
    try:  # written by the job: what is not as the screen writes it is said, never a crash
        result = files.ScreenResult.from_json(text)
    except files.ProtocolFileError as exc:
        return _noted(status, f"{files.unreadable(protocol.SCREEN_FILE, exc)}"), []
    left_out = [{"node": n.node, "evidence": f"screened: {n.why}"} for n in result.left_out]
    if record.screen is None:
        db.screened(record.id, json.loads(text))
    else:
        left_out = []  # remembered when it was first read
    if not result.left_out:
        return status, left_out
    said = f"screen {result.verdict}: {','.join(n.node for n in result.left_out)}"
    return _noted(status, f"{said} ({result.left_out[0].why})"), left_out


def _stragglers(status: JobStatus, record: JobRecord, host: Host) -> JobStatus:
    """A running job's stragglers, as its trainers named them (STRAGGLERS_FILE in its run
    directory): in its reason, with the rank, the node and how much slower."""
    if status.state is not JobState.RUNNING or not record.run_dir:
        return status
    try:
        text = host.read_from(posixpath.join(record.run_dir, protocol.STRAGGLERS_FILE), 0)
        found = json.loads(text or b"{}").get("stragglers", [])
        said = [
            f"straggler: rank {s['rank']} on {s['node']} at {s['of_median']:.1%} of the other "
            f"ranks (steps {s['since']}-{s['step']})"
            for s in found
        ]
    except (MmmError, OSError, ValueError, TypeError, KeyError, AttributeError):
        return status  # none, or not as the trainers write it: nothing to say
    return _noted(status, "; ".join(said)) if said else status


def _failover_status(status: JobStatus, state: files.FailoverState) -> JobStatus:
    parts = [f"attempt {state.attempt}/{state.attempts}"]
    if retired := state.retired:
        parts.append(
            ", ".join(
                f"{entry.node} retired{' (blind)' if entry.blind else ''}" for entry in retired
            )
            + f" ({retired[-1].evidence[:80]})"
        )
    if status.state is JobState.RUNNING:
        parts.append(f"active {','.join(state.active)}, spare {','.join(state.spares) or 'none'}")
        return dataclasses.replace(status, reason="; ".join(parts))
    # Ended outside the loop's view (killed), or in a state whose own words say more (resumable
    # at step N, hung after step N, cancelled): those first.
    if state.verdict is None or status.state in (
        JobState.TIMEOUT,
        JobState.HUNG,
        JobState.CANCELLED,
    ):
        return dataclasses.replace(status, reason="; ".join([status.reason, *parts]).strip("; "))
    if state.verdict != "success":
        parts.append(f"{state.verdict}: {(state.reason or '')[:120]}")
    return dataclasses.replace(status, reason="; ".join(parts))
