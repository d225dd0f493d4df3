"""Refresh job states: one batched scheduler query per (machine, host), terminal jobs never
asked again, and an unreachable scheduler turns into stale rows, not an error."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.hosts import Host, host_for
from mmm_orch.jobs.db import JobDB, JobRecord
from mmm_orch.jobs.logs import tail
from mmm_orch.schedulers.base import JobRef, scheduler_for
from mmm_orch.schedulers.states import JobState, JobStatus
from mmm_orch.watchdog import HUNG_EXIT, HUNG_MARKER


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
    groups: dict[tuple[str, str], list[JobRecord]] = {}
    for record in records:
        if not record.terminal and record.native_id:
            groups.setdefault((record.machine, record.host), []).append(record)
    updates: dict[int, JobStatus] = {}
    now = time.time()
    for (machine, host_name), group in groups.items():
        newest = max(group, key=lambda r: r.id)
        host = host_for(newest.remote)
        scheduler = scheduler_for(newest.scheduler, newest.commands, host)
        by_native = {r.native_id: r for r in group}
        try:
            statuses = scheduler.query([JobRef(r.native_id, Path(r.job_dir)) for r in group])
            for native_id, status in statuses.items():
                if native_id in by_native:
                    updates[by_native[native_id].id] = _hung_or(status, by_native[native_id], host)
        except MmmError as exc:
            outcome.warnings.append(
                f"{machine} ({host_name}): scheduler not reachable, showing last known states: {exc}")
            outcome.stale.update({r.id: now - r.checked_at for r in group})
    db.apply(updates, now)
    return outcome


def _hung_or(status: JobStatus, record: JobRecord, host: Host) -> JobStatus:
    """A job that failed with the watchdog's exit code and whose log ends with its marker was
    hung, not merely failed; the marker says after which step."""
    if status.state is not JobState.FAILED or status.exit_code != HUNG_EXIT:
        return status
    text, _ = tail(host, record.log_path, 40)
    for line in reversed(text.decode(errors="replace").splitlines()):
        if HUNG_MARKER in line:
            reason = line.split(HUNG_MARKER, 1)[1].split("; stopping")[0].strip()
            return dataclasses.replace(status, state=JobState.HUNG, reason=reason)
    return status
