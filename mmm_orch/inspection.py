"""The use cases that read what a job left, under the CLI (timeline, diagnose, logs) and the
Python API alike: each refreshes the job first, then reads its log or run directory, and
returns values; printing is the caller's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.jobs.db import JobDB
from mmm_orch.jobs.record import JobRecord


def fresh(db: JobDB, record: JobRecord) -> JobRecord:
    """`record` as the scheduler has it now (terminal records are not asked again)."""
    from mmm_orch.jobs.track import refresh

    refresh(db, [record])
    return db.get(record.id, events=False) or record


@dataclass(frozen=True)
class Timeline:
    record: JobRecord
    events: list[dict[str, Any]]  # event, at (epoch), gap_s (to the one before)
    startup_s: float | None  # job start to first step
    has_log: bool
    first_step_seen: bool
    launch_ended: bool


def timeline(db: JobDB, record: JobRecord) -> Timeline:
    from mmm_orch.hosts import host_for
    from mmm_orch.jobs import logs, startup

    record = fresh(db, record)
    text = logs.head_and_tail(host_for(record.remote), record.log_path) or ""
    markers = startup.parse_markers(text)
    rows = startup.timeline(record.submitted_at, markers, record.ended_at)
    return Timeline(record, rows, markers.startup_s, bool(text), markers.first_step is not None,
                    markers.launch_end is not None)


@dataclass(frozen=True)
class Diagnosis:
    record: JobRecord
    result: Any  # injob.diagnose.Diagnosis: the first failure, what came later, the fallout
    blamed: str  # the node remembered as bad because of it ("" = none)


def diagnose(db: JobDB, record: JobRecord) -> Diagnosis:
    """The first known failure in the job's log (and the scheduler's own reason); a node that
    lost the job's ranks is remembered as bad, so that later jobs on the machine avoid it."""
    from mmm_orch.config.failures import machine_failures
    from mmm_orch.hosts import host_for
    from mmm_orch.injob import diagnose as signatures
    from mmm_orch.jobs import logs

    record = fresh(db, record)
    _has_run(record)
    log = logs.head_and_tail(host_for(record.remote), record.log_path, head=256 << 20,
                             last=16 << 20)
    if log is None:
        raise MmmError(f"job {record.id} has no log yet ({record.state.value}): {record.log_path}")
    # The scheduler's own word (a PBS comment, a Slurm reason) can be the whole story.
    text = log + (f"\nscheduler: {record.reason}\n" if record.reason else "")
    result = signatures.diagnose(text, machine_failures(record.machine))
    first = result.first
    blamed = first.host if first is not None and first.signature.node_fault and first.host else ""
    if blamed:
        db.blame_node(record.machine, blamed, first.line, record.id)
    return Diagnosis(record, result, blamed)


def _has_run(record: JobRecord) -> None:
    """A packed point that never started has no log to read."""
    from mmm_orch.schedulers.states import JobState

    if record.state is JobState.NOT_STARTED:
        raise MmmError(f"job {record.id} never started ({record.reason}): it has no log; "
                       "`mmm-orch rerun` of its pack job runs it")


def log_text(record: JobRecord, tail: int | None = None) -> tuple[bytes | None, int]:
    """The job's log so far (its last `tail` lines), and the offset it ends at; None before the
    job writes one."""
    from mmm_orch.hosts import host_for
    from mmm_orch.jobs import logs

    _has_run(record)
    host = host_for(record.remote)
    end = host.size(record.log_path)
    if end is None:
        return None, 0
    if tail is not None:
        return logs.tail(host, record.log_path, tail)
    return host.read_from(record.log_path, 0, end) or b"", end


def metrics(record: JobRecord) -> list[dict[str, Any]]:
    """The run's step records (metrics.jsonl), read as a report reads them: bounded, and rows
    that are not step records left out."""
    from mmm_orch.reporting import data

    return data.collect([record])[0].steps
