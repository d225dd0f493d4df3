"""A job in the Python API (mmm_orch.api): a handle on a recorded job, in this process or found
again from another, with the verbs of the command line (status, wait, logs, cancel, timeline,
diagnose, rerun) going through the same use cases."""

from __future__ import annotations

import math
import operator
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, overload

from mmm_orch import usecases
from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.usecases import MAX_INT, JobDB, JobRecord, backlogs, following, inspection, reruns

# One connection per database file and process (records/db.py): threads take turns with it.
lock = threading.RLock()


# The API's checks of Python values, one per kind, each returning the value made plain (a str or
# int subclass's own __str__ is never called later, e.g. by an f-string deep inside).


# Each `..._of` with `none`: None passes too; without, the value is never None.
@overload
def text_of(field: str, value: Any, none: Literal[False] = False) -> str: ...
@overload
def text_of(field: str, value: Any, none: bool) -> str | None: ...
def text_of(field: str, value: Any, none: bool = False) -> str | None:
    """A str, left to be checked by what reads it (planning says what a name may be, in the
    command line's words)."""
    if none and value is None:
        return None
    if not isinstance(value, str):
        raise InvalidValue(field, value, "a str" + (" or None" if none else ""))
    return str.__str__(value)


@overload
def name_of(field: str, value: Any, none: Literal[False] = False) -> str: ...
@overload
def name_of(field: str, value: Any, none: bool) -> str | None: ...
def name_of(field: str, value: Any, none: bool = False) -> str | None:
    """A name nothing downstream checks (a filter, a login host): one line, not empty."""
    value = text_of(field, value, none)
    if value is not None and (not value or not value.isprintable()):
        raise InvalidValue(
            field, value, "a name: one line of text, not empty" + (", or None" if none else "")
        )
    return value


@overload
def path_of(field: str, value: Any, none: Literal[False] = False) -> str: ...
@overload
def path_of(field: str, value: Any, none: bool) -> str | None: ...
def path_of(field: str, value: Any, none: bool = False) -> str | None:
    """A file's path (str or pathlib.Path): one line, not empty."""
    if none and value is None:
        return None
    plain = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(plain, str) or not plain or not plain.isprintable():
        raise InvalidValue(
            field, value, "a path (str or Path), one line" + (", or None" if none else "")
        )
    return str.__str__(plain)


@overload
def whole_of(
    field: str, value: Any, low: int, high: int = MAX_INT, none: Literal[False] = False
) -> int: ...
@overload
def whole_of(
    field: str, value: Any, low: int, high: int = MAX_INT, *, none: bool
) -> int | None: ...
def whole_of(
    field: str, value: Any, low: int, high: int = MAX_INT, none: bool = False
) -> int | None:
    if none and value is None:
        return None
    try:  # any integer type (numpy's too), never a bool, as a plain int
        plain = int.__int__(operator.index(value)) if not isinstance(value, bool) else None
    except Exception:  # noqa: BLE001 - a caller's __index__ may raise anything
        plain = None
    if plain is None or not low <= plain <= high:
        allowed = (
            f"a whole number {low}-{high}"
            if high < MAX_INT
            else f"a whole number >= {low} (below 2**63)"
        )
        raise InvalidValue(field, value, allowed + (" or None" if none else ""))
    return plain


@overload
def number_of(
    field: str, value: Any, zero: bool = False, none: Literal[False] = False
) -> float: ...
@overload
def number_of(field: str, value: Any, zero: bool = False, *, none: bool) -> float | None: ...
def number_of(field: str, value: Any, zero: bool = False, none: bool = False) -> float | None:
    """A finite number of seconds or node-hours: greater than 0 (`zero`: or 0)."""
    if none and value is None:
        return None
    try:
        plain = (
            float(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            else math.nan
        )
    except Exception:  # noqa: BLE001 - an int past a float's range, a caller's __float__
        plain = math.nan
    if not (math.isfinite(plain) and (plain >= 0 if zero else plain > 0)):
        raise InvalidValue(
            field,
            value,
            ("a finite number >= 0" if zero else "a finite number > 0")
            + (" or None" if none else ""),
        )
    return plain


def flag_of(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue(field, value, "True or False")
    return value


def items_of(field: str, value: Any, what: str, example: str) -> list[Any]:
    """The items of a list (or any iterable but a str, bytes or mapping), not yet checked."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidValue(field, value, f"a list of {what}, e.g. {example}")
    return list(value)


def jobs_of(field: str, value: Any, empty: bool = True) -> list[Job]:
    found = items_of(field, value, "Jobs", "mmm_orch.jobs()")
    if not all(isinstance(each, Job) for each in found) or not (found or empty):
        raise InvalidValue(
            field,
            value,
            "a " + ("" if empty else "non-empty ") + "list of Jobs, e.g. mmm_orch.jobs()",
        )
    return found


def opened(path: str | None) -> JobDB:
    """The job database at `path` (None: the default one); there must be one."""
    db = following.open_jobs(path)
    if db is None:
        raise MmmError("no job database yet: nothing was submitted")
    return db


def refresh(jobs: Iterable[Job]) -> list[Job]:
    """Ask the schedulers about these jobs at once (one query per machine and host, as `status`
    does; ended jobs are not asked again) and update each."""
    jobs = jobs_of("jobs", jobs)
    by_db: dict[str | None, list[Job]] = {}
    for job in jobs:
        by_db.setdefault(job.db, []).append(job)
    with lock:
        for path, group in by_db.items():
            db = opened(path)
            if any(job.record.state is usecases.JobState.WAITING for job in group):
                backlogs.move(db)  # a waiting run's wait moves the backlog, as `status` does
            fresh = {r.id: r for r in following.refresh(db, [job.record for job in group]).records}
            for job in group:
                job.record = fresh.get(job.id, job.record)
    return jobs


class Job:
    """A recorded job. Its fields are as last refreshed (`refresh()`, `wait()`, or the module's
    refresh() for many at once)."""

    def __init__(self, record: JobRecord, db: str | Path | None = None):
        if not isinstance(record, JobRecord):
            raise InvalidValue(
                "record", record, "a JobRecord (Jobs come from submit(), job(), jobs())"
            )
        self.record = record
        # The job database's path; None: the default ($MMM_ORCH_DB, XDG state).
        self.db = path_of("db", db, none=True)

    def __eq__(self, other: object) -> bool:  # the same recorded job, however it was found
        return isinstance(other, Job) and (self.id, self.db) == (other.id, other.db)

    def __hash__(self) -> int:
        return hash((self.id, self.db))

    def __repr__(self) -> str:
        return (
            f"Job({self.id}, {self.workload} on {self.machine}, {self.state}, "
            f"{self.record.scheduler} id {self.native_id or '-'})"
        )

    id = property(lambda self: self.record.id)
    native_id = property(lambda self: self.record.native_id)
    machine = property(lambda self: self.record.machine)
    workload = property(lambda self: self.record.workload)
    state = property(lambda self: self.record.state.value)
    exit_code = property(lambda self: self.record.exit_code)
    reason = property(lambda self: self.record.reason)
    done = property(lambda self: self.record.terminal)
    log_path = property(lambda self: self.record.log_path)
    run_dir = property(lambda self: self.record.run_dir)

    def to_dict(self) -> dict[str, Any]:
        """Its record as plain data, as `mmm-orch status --json` shows a job."""
        return self.record.to_dict()

    def refresh(self) -> Job:
        """Ask the scheduler where it stands now (as `mmm-orch status JOB`); itself."""
        refresh([self])
        return self

    def wait(self, timeout: float | None = None, poll: float = 2.0, max_poll: float = 30.0) -> Job:
        """Until the job has ended: refresh every `poll` seconds, backing off to `max_poll`.
        TimeoutError after `timeout` seconds (the job goes on)."""
        timeout = number_of("timeout", timeout, zero=True, none=True)
        poll, max_poll = number_of("poll", poll), number_of("max_poll", max_poll)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} still {self.state} after {timeout} s")
            pause = poll if deadline is None else min(poll, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            poll = min(max_poll, poll * 1.5)
        return self

    def logs(self, tail: int | None = None) -> str:
        """The log so far ('' before the job writes one); its last `tail` lines."""
        log, _ = inspection.log_text(self.record, whole_of("tail", tail, 0, none=True))
        return log or ""

    def follow(self) -> Iterator[str]:
        """The log as it is written (whole lines), until the job ends."""
        yield from following.follow_log(self.record, lambda: self.refresh().done)

    def cancel(self) -> list[str]:
        """Cancel it (a link of a chain: the chain), as `mmm-orch cancel`; what happened, in
        words."""
        with lock:
            said = list(usecases.cancel(opened(self.db), [self.record]))
        self.refresh()
        return said

    def timeline(self) -> list[dict[str, Any]]:
        """Its events (submitted, job start, launch, first step, ...), each with `at` and
        `gap_s`, as `mmm-orch timeline`."""
        with lock:
            found = inspection.timeline(opened(self.db), self.record)
        self.record = found.record
        return found.events

    def diagnose(self) -> dict[str, Any]:
        """The first known failure in its log, as `mmm-orch diagnose --json`."""
        with lock:
            found = inspection.diagnose(opened(self.db), self.record)
        self.record = found.record
        return {"log": self.log_path, **found.result.to_dict(), "blamed": found.blamed}

    def metrics(self) -> list[dict[str, Any]]:
        """The run's step records (step, loss, dt, throughput, ...), one dict per step."""
        return inspection.metrics(self.record)

    def rerun(self, resume: bool | None = None) -> Job:
        """Submit its recorded plan again. `resume` True: from its run's latest checkpoint;
        False: from the start; None: as the way it ended calls for (`end_class`: docs/reference/
        exit-codes.md). A pack job: a new pack of its points that did not complete."""
        resume = None if resume is None else flag_of("resume", resume)
        with lock:
            return Job(reruns.rerun(self.record, resume, self.db), self.db)

    @property
    def links(self) -> list[Job]:
        """Every job of its chain or sweep (itself alone when in neither), in order."""
        if self.record.group_id is None:
            return [self]
        with lock:
            records = opened(self.db).list(group_id=self.record.group_id)
        return [Job(r, self.db) for r in sorted(records, key=lambda r: (r.group_index or 0, r.id))]

    @property
    def job_dir(self) -> Path:
        return Path(self.record.job_dir)
