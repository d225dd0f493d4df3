"""Refresh job states: one batched scheduler query per (machine, host), terminal jobs never
asked again, and an unreachable scheduler turns into stale rows, not an error."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.jobs.db import JobDB, JobRecord
from mmm_orch.schedulers.base import JobRef, scheduler_for
from mmm_orch.schedulers.states import JobStatus


@dataclass
class Refresh:
    stale: dict[int, float] = field(default_factory=dict)  # job id -> age of its last known state (s)
    warnings: list[str] = field(default_factory=list)


def refresh(db: JobDB, records: list[JobRecord]) -> Refresh:
    groups: dict[tuple[str, str], list[JobRecord]] = {}
    for record in records:
        if not record.terminal:
            groups.setdefault((record.machine, record.host), []).append(record)
    outcome = Refresh()
    updates: dict[int, JobStatus] = {}
    now = time.time()
    for (machine, host), group in groups.items():
        newest = max(group, key=lambda r: r.id)
        scheduler = scheduler_for(newest.scheduler, newest.commands)
        by_native = {r.native_id: r for r in group}
        try:
            statuses = scheduler.query([JobRef(r.native_id, Path(r.job_dir)) for r in group])
        except MmmError as exc:
            outcome.warnings.append(
                f"{machine} ({host}): scheduler not reachable, showing last known states: {exc}")
            outcome.stale.update({r.id: now - r.checked_at for r in group})
            continue
        for native_id, status in statuses.items():
            if native_id in by_native:
                updates[by_native[native_id].id] = status
    db.apply(updates, now)
    return outcome
