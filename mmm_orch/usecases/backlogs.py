"""The backlog: runs recorded `waiting` (submit, sweep and chain with --backlog), submitted in the
order they came as the facility's job limits admit them, each exactly once; its waiting runs,
and its mover, once or every few seconds, for the CLI and the Python API.

`move` is the mover. Whoever runs it (`mmm-orch backlog`, every `status`, a cron or scrontab
line, a loop on a login node: docs/guides/backlog.md) does the same, safely at once with
another:

1. It takes the database's mover lease (records/waiting.py), or leaves the moving to whoever
   holds it. A mover killed holding it is passed over once its process is gone (this host) or
   the lease ran out (LEASE_S; another host).
2. The open jobs on the machines runs wait for are refreshed as `status` refreshes them: a
   submission cut off (a mover killed inside `qsub`) is settled by its tag (settle.py), and a
   chain's link sees whether the link before it ended.
3. Per queue the runs wait for (with its machine, login host and project), in the order they
   came: while a submission there is still of unknown outcome, that queue's backlog waits (its
   job may be in the queue already). A chain's link waits for the link before it to end, and is
   taken out once the chain finished or stopped. The user's jobs in the queue are counted as the
   scheduler lists them now (jobs submitted by hand count) against the profile's job limits
   (planning/occupancy.py); while one more fits, the next run is claimed (waiting -> submitting,
   a compare-and-set: a run is taken once) and handed to the scheduler by the submit protocol of
   submission/submit.py (submit_waiting), and the queue is counted again.

A claimed run the scheduler never took goes back to its place (settle.py's requeue); one the
scheduler refused in its own words fails with them. Nothing here waits on a job."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager

from mmm_orch.config.registry import load_machine
from mmm_orch.errors import MmmError, one_line
from mmm_orch.hosts import host_for
from mmm_orch.planning.model import Plan
from mmm_orch.planning.occupancy import past_limit
from mmm_orch.planning.store import stored_plan
from mmm_orch.progress.refresh import refresh
from mmm_orch.records.db import JobDB
from mmm_orch.records.record import ALLOCATION, JobRecord
from mmm_orch.schedulers.states import JobState
from mmm_orch.submission import chains, queue_load
from mmm_orch.submission.settle import submitter_alive
from mmm_orch.submission.submit import submit_waiting, submitter

# How long a mover holds the lease without renewing it (it renews at every submission): a
# mover on another login node killed holding it is passed over after this.
LEASE_S = 120.0


@dataclasses.dataclass
class Moved:
    """What one move did: the runs it submitted (their records), and what it says."""

    submitted: list[JobRecord] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def move(db: JobDB) -> Moved:
    """Submit the waiting runs the queues admit now (see the module's docstring)."""
    moved = Moved()
    if not waiting(db):
        return moved
    with lease(db) as held:
        if not held:
            moved.notes.append("another mmm-orch is moving the backlog now")
            return moved
        _refresh_open(db, moved)
        records = [db.get(run.id, events=False) for run in waiting(db)]
        for runs in queues([run for run in records if run is not None]):
            try:
                _move_queue(db, runs, moved)
            except MmmError as exc:  # that queue waits; the others move
                moved.notes.append(f"{_where(runs[0])}: not moved now: {one_line(str(exc))}")
            if not db.backlog.lease(submitter(), LEASE_S, gone=lambda holder: False):
                moved.notes.append("the backlog's lease passed to another mover: it moves on")
                break  # held too long (a scheduler command that hung): never two movers
    return moved


@contextmanager
def lease(db: JobDB) -> Iterator[bool]:
    """The mover's lease while the block runs (False: another mover holds it)."""
    me = submitter()
    held = db.backlog.lease(me, LEASE_S, gone=lambda holder: submitter_alive(holder) is False)
    try:
        yield held
    finally:
        if held:
            db.backlog.release(me)


def queues(runs: list[JobRecord]) -> list[list[JobRecord]]:
    """The waiting runs by the queue they wait for (machine, login host, project, queue), each
    list first come first, the lists in the order of their first run."""
    by_queue: dict[tuple, list[JobRecord]] = {}
    for run in runs:
        queue = (run.plan or {}).get("queue") or {}
        key = (run.machine, run.remote, run.account, queue.get("name"))
        by_queue.setdefault(key, []).append(run)
    return list(by_queue.values())


def _move_queue(db: JobDB, runs: list[JobRecord], moved: Moved) -> None:
    first = runs[0]
    if _unsettled(db, first):
        _waiting_because(db, runs, "a submission before it is not settled yet")
        return
    for place, run in enumerate(runs):
        ready, ended = chains.ready_link(db, run)
        if ended:  # a link of a chain that finished or stopped: it never runs
            if db.backlog.withdraw(run.id, f"not submitted: {ended}"):
                moved.notes.append(f"job {run.id} taken out of the backlog: {ended}")
            continue
        if not ready:  # a chain's link waits for the one before it to end
            _note(db, run, "waiting in the backlog for the chain's link before it to end")
            continue
        plan = stored_plan(run.plan, f"job {run.id}'s recorded plan")
        full = _full(plan, run.remote, db)
        if full:
            _waiting_because(db, runs[place:], full)
            return
        if not db.backlog.lease(submitter(), LEASE_S, gone=lambda holder: False):
            return  # the lease ran out meanwhile (move() says so): another mover has it now
        record = submit_waiting(db, run, plan)
        if record is not None:
            moved.submitted.append(record)
            group = chains.chain_of(db, record)
            if group is not None and record.group_index is not None:
                spec = group["spec"]
                chains.write_link_id(
                    host_for(spec["remote"]), spec["dir"], record.group_index, record.native_id
                )


def _refresh_open(db: JobDB, moved: Moved) -> None:
    """The states of the open jobs on the machines runs wait for, as `status` refreshes them
    (a chain's link waits for the one before to end; a cut-off submission is settled)."""
    machines = {run.machine for run in waiting(db)}
    open_jobs = [
        r
        for r in db.list(open_only=True)
        if r.machine in machines and r.state is not JobState.WAITING
    ]
    if open_jobs:
        moved.notes += refresh(db, open_jobs).warnings


def _unsettled(db: JobDB, run: JobRecord) -> bool:
    """Whether a submission to `run`'s machine (and login host) is of unknown outcome still."""
    return any(
        r.remote == run.remote for r in db.list(state=JobState.SUBMITTING, machine=run.machine)
    )


def _full(plan: Plan, remote: str, db: JobDB) -> str | None:
    """Why one more job does not fit `plan`'s queue now (None: it does)."""
    if not queue_load.limits_apply(plan):
        return None
    machine = load_machine(plan.machine)
    queue = machine.queue(plan.queue.name or "")
    if queue is None:
        return None  # a queue the profile no longer lists: the scheduler decides
    load = queue_load.read(plan, remote, db)
    return past_limit(machine, queue, plan.queue.directives, load, plan.queue.account, 1)


def _waiting_because(db: JobDB, runs: list[JobRecord], why: str) -> None:
    """Each run's reason: its place in its queue's backlog and why it waits (written where it
    changed: every `status` moves the backlog)."""
    for place, run in enumerate(runs, start=1):
        _note(db, run, f"waiting, {_ordinal(place)} in the backlog: {why}")


def _note(db: JobDB, run: JobRecord, reason: str) -> None:
    if run.reason != reason:
        db.note(run.id, reason)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _where(run: JobRecord) -> str:
    queue = ((run.plan or {}).get("queue") or {}).get("name")
    return f"{run.machine}" + (f" queue {queue}" if queue else "")


def waiting(db: JobDB | None) -> list[JobRecord]:
    """The runs waiting in the backlog, first come first (not those sent into a held
    allocation: it starts them itself)."""
    if db is None:
        return []
    held = db.groups.of_kind(ALLOCATION)
    return [run for run in db.list(state=JobState.WAITING) if run.group_id not in held]


def moving(db: JobDB | None, every: float | None, lasting: float | None) -> Iterator[Moved]:
    """The backlog moved once (`every` None), or every `every` seconds while runs wait, for at
    most `lasting` seconds (a mover on a login node): what each move did."""
    if db is None:
        yield Moved()
        return
    until = None if lasting is None else time.time() + lasting
    while True:
        yield move(db)
        if every is None or not waiting(db) or (until is not None and time.time() >= until):
            return
        time.sleep(every)
