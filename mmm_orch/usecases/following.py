"""The use cases that follow recorded jobs, under the CLI and the Python API alike: finding a job
by its id, which jobs `status` shows and their states now (one refresh for all of them), the
same again every few seconds (`--watch`), and a job's log followed until the job ends. Each
returns values; printing is the caller's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmm_orch.config.registry import names, unknown_name
from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.progress import logs
from mmm_orch.progress.refresh import Refresh, refresh
from mmm_orch.records.db import JobDB, open_db
from mmm_orch.records.record import JobRecord
from mmm_orch.submission import chains, sweeps
from mmm_orch.usecases import backlogs

RECENT = 20  # jobs `status` shows without ids or --all, besides every open one


def open_jobs(path: str | None, create: bool = False) -> JobDB | None:
    """The checked job database, or None when there is none yet (and `create` is False)."""
    return open_db(path, create=create)


def job(db: JobDB | None, job_id: int) -> JobRecord:
    """The record of `job_id`, or an error that says which ids exist."""
    record = db.get(job_id) if db is not None else None
    if record is None:
        known = db.id_range() if db is not None else None
        where = f" in {db.path}" if db is not None else ""
        raise MmmError(
            f"job {job_id} not found{where}"
            + (f"; known ids are {known[0]}-{known[1]}" if known else "; no jobs recorded yet")
        )
    return record


def run_dir(db: JobDB | None, target: str) -> Path:
    """The run directory `target` names: a directory, or a job's id (its recorded run, which
    must be readable here)."""
    if not (target.isascii() and target.isdigit()) or Path(target).is_dir():
        return Path(target)
    record = job(db, int(target))
    if record.remote:
        raise MmmError(
            f"job {record.id} ran through {record.remote}: its run directory "
            f"{record.run_dir or ''} is there; run `python -m mmm_orch ...` with that "
            "directory on it"
        )
    if not record.run_dir:
        raise MmmError(f"job {record.id} ({record.workload}) keeps no run directory")
    return Path(record.run_dir)


def recorded(
    db: JobDB | None, machine: str | None = None, sweep: int | None = None, limit: int | None = None
) -> list[JobRecord]:
    """Recorded jobs, oldest first: of `machine`, of `sweep` (its points), the last `limit`."""
    if db is None:
        return []
    if sweep is not None:
        return [r for r in sweeps.sweep_jobs(db, sweep)[1] if machine in (None, r.machine)]
    return sorted(db.list(machine=machine, limit=limit), key=lambda r: r.id)


def check_known(kind: str, name: str | None, db: JobDB | None) -> None:
    """A filter by machine or workload (`kind`: "machines", "workloads") must name a profile or
    spec, or one that jobs were recorded with."""
    if name is None:
        return
    if db is None:
        recorded: set[str] = set()
    elif kind == "machines":
        recorded = db.machines()
    else:
        recorded = {r.workload for r in db.list()}
    known = set(names(kind)) | recorded
    if name not in known:
        raise unknown_name(kind.removesuffix("s"), name, sorted(known))


@dataclass(frozen=True)
class Group:
    """A chain's links or a sweep's points, shown as one line (`summary`: its state and note,
    as submission/chains.py and submission/sweeps.py sum them up)."""

    kind: str  # "chain" or "sweep"
    id: int
    spec: dict[str, Any]
    members: list[JobRecord]
    summary: dict[str, Any]


@dataclass(frozen=True)
class Status:
    """The jobs asked about as they are now, and the same as lines to show: a job, or a whole
    chain or sweep where its members are folded into one."""

    refresh: Refresh
    lines: list[JobRecord | Group]

    @property
    def records(self) -> list[JobRecord]:
        return self.refresh.records

    @property
    def ended(self) -> bool:
        return all(r.terminal for r in self.records)


def status(
    db: JobDB | None,
    ids: Iterable[int] = (),
    machine: str | None = None,
    all_jobs: bool = False,
    sweep: int | None = None,
    links: bool = False,
) -> Status:
    """The jobs `ids` (and those of `sweep`), all of them, or the recent and the open ones, of
    `machine`, refreshed at once, the backlog moved first. A chain's links fold into one line unless `links`; a sweep's
    points fold unless it is the sweep asked for."""
    wanted = list(ids)
    check_known("machines", machine, db)
    for job_id in wanted:
        job(db, job_id)
    if sweep is not None and db is not None:
        wanted += [r.id for r in sweeps.members(db, sweep)]
    if db is None:
        return Status(Refresh(), [])
    notes = backlogs.move(db).notes  # whoever looks moves the backlog (usecases/backlogs.py)
    outcome = refresh(db, _selected(db, wanted, machine, all_jobs))
    outcome.warnings += notes
    return Status(
        outcome, _folded(db, outcome.records, fold_chains=not links, fold_sweeps=sweep is None)
    )


def watch(db: JobDB | None, interval: float, **asked: Any) -> Iterator[Status]:
    """`status(db, **asked)` now and every `interval` seconds, until every job shown ended."""
    while True:
        now = status(db, **asked)
        yield now
        if now.ended:
            return
        time.sleep(interval)


def _selected(db: JobDB, ids: list[int], machine: str | None, all_jobs: bool) -> list[JobRecord]:
    """The jobs to show: every open one among them, so that one refresh covers them all."""
    if ids or all_jobs:
        return db.list(ids=ids, machine=machine)
    recent = db.list(limit=RECENT, machine=machine)
    shown = {r.id for r in recent}
    older = [r for r in db.list(open_only=True, machine=machine) if r.id not in shown]
    return older + recent


def _folded(
    db: JobDB, records: list[JobRecord], fold_chains: bool, fold_sweeps: bool
) -> list[JobRecord | Group]:
    summaries: dict[str, Callable[[dict[str, Any], list[JobRecord]], dict[str, Any]]] = (
        {"chain": chains.summary} if fold_chains else {}
    )
    if fold_sweeps:
        summaries["sweep"] = sweeps.summary
    lines: list[JobRecord | Group] = []
    groups: dict[int, dict[str, Any] | None] = {}
    shown: set[int] = set()
    for record in records:
        if record.group_id is not None:
            if record.group_id not in groups:
                groups[record.group_id] = db.groups.get(record.group_id)
            group = groups[record.group_id]
            if group and group["kind"] in summaries:
                if record.group_id not in shown:
                    shown.add(record.group_id)
                    members = db.list(group_id=record.group_id)
                    lines.append(
                        Group(
                            group["kind"],
                            group["id"],
                            group["spec"],
                            members,
                            summaries[group["kind"]](group, members),
                        )
                    )
                continue
        lines.append(record)
    return lines


def follow(
    db: JobDB,
    job_id: int,
    strip_ansi: bool,
    start: int = 0,
    on_wait: Callable[[str], None] = lambda path: None,
) -> Iterator[str]:
    """The job's log from byte `start` on, as it grows, until the job ended (`on_wait(path)` once
    while it has none yet)."""

    def done() -> bool:
        now = refresh(db, [job(db, job_id)]).records
        return not now or now[0].terminal  # (none: a submission that never went through)

    return follow_log(job(db, job_id), done, strip_ansi, start, on_wait)


def follow_log(
    record: JobRecord,
    done: Callable[[], bool],
    strip_ansi: bool = False,
    start: int = 0,
    on_wait: Callable[[str], None] = lambda path: None,
) -> Iterator[str]:
    """`record`'s log from byte `start` on, whole lines as they are written, until `done()`."""
    for chunk in logs.follow(
        host_for(record.remote),
        record.log_path,
        done,
        start=start,
        on_wait=lambda: on_wait(record.log_path),
    ):
        yield logs.clean(chunk, strip_ansi)


def log_end(record: JobRecord) -> int:
    """How far the job's log goes now (0 before it has one): where a later follow starts."""
    return host_for(record.remote).size(record.log_path) or 0
