"""Read what the user and their project already have in a machine's queues: one query of the
scheduler where the job would be submitted (here or on the login node), or, when it does not
answer, the open jobs mmm-orch recorded there. Queue selection counts them against the
profile's job limits (planning/occupancy.py)."""

from __future__ import annotations

import shutil
import subprocess

from mmm_orch.config.registry import load_machine
from mmm_orch.errors import MmmError, QueueFull, one_line
from mmm_orch.hosts import host_for
from mmm_orch.planning.model import Plan
from mmm_orch.planning.occupancy import QueueLoad, past_limit, queue_names, way_out
from mmm_orch.planning.queue_choice import queues_with_room
from mmm_orch.records.db import JobDB
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.states import JobState, OpenJob


def limits_apply(planned: Plan) -> bool:
    """Whether a limit that refuses submissions applies to the plan's queue (its own, or the
    machine's over all queues): only then are the user's jobs counted."""
    if planned.queue.name is None:
        return False
    machine = load_machine(planned.machine)
    queue = machine.queue(planned.queue.name)
    limits = [*(queue.job_limits if queue else ()), *machine.job_limits]
    return any(limit.refuses for limit in limits)


def read(planned: Plan, remote: str | None, db: JobDB | None) -> QueueLoad:
    """The user's (and the plan's project's) unfinished jobs on its machine, from its scheduler
    on `remote` ('' here); None: a review, which asks only a scheduler on this computer and
    reads the records otherwise (it contacts no login node)."""
    scheduler = scheduler_for(
        planned.scheduler, planned.scheduler_commands, host_for(remote) if remote else None
    )
    if remote is None and not shutil.which(scheduler.submit_command):
        return QueueLoad(
            recorded(db, planned.machine),
            f"from mmm-orch's records: {scheduler.submit_command} is not on this computer",
        )
    try:
        jobs = scheduler.open_jobs(planned.queue.account)
    except (MmmError, OSError, subprocess.TimeoutExpired) as exc:
        return QueueLoad(
            recorded(db, planned.machine),
            f"from mmm-orch's records: the scheduler did not answer ({one_line(str(exc))})",
        )
    return QueueLoad(tuple(jobs), f"{planned.scheduler} on {remote or 'this computer'}")


def check_room(planned: Plan, jobs: int, load: QueueLoad) -> None:
    """Refuse a plan whose queue is fixed (named, made before, recorded) when `jobs` more of the
    user's would pass one of its limits: one line with the limit, its source, the jobs there
    and the way out."""
    machine = load_machine(planned.machine)
    queue = machine.queue(planned.queue.name or "")
    if queue is None:
        return  # a recorded queue the profile no longer lists: the scheduler decides
    full = past_limit(machine, queue, planned.queue.directives, load, planned.queue.account, jobs)
    if full:
        room = queues_with_room(
            machine,
            planned.layout.nodes + planned.placement.spare_nodes,
            planned.queue.walltime,
            load,
            planned.queue.account,
            jobs,
        )
        raise QueueFull(f"queue {queue.name!r} is full for you: {full}. {way_out(room)}")


def recorded(db: JobDB | None, machine: str) -> tuple[OpenJob, ...]:
    """The jobs mmm-orch submitted to `machine` and has not seen end, as the scheduler would
    list them (the queue names their recorded plans asked for)."""
    if db is None:
        return ()
    jobs = []
    for row in db.list(open_only=True, machine=machine):
        if row.state is JobState.WAITING:  # in the backlog, not in a queue
            continue
        record = db.get(row.id, events=False)
        if record is None:  # removed since the listing: a submission the scheduler never took
            continue
        queue = (record.plan or {}).get("queue") or {}
        names = queue_names(tuple(d for d in queue.get("directives") or () if isinstance(d, str)))
        if isinstance(queue.get("tier"), str):
            names |= {queue["tier"]}
        jobs.append(
            OpenJob(
                native_id=row.native_id or f"job {row.id}",
                names=names,
                running=row.state is JobState.RUNNING,
                mine=True,
                account=row.account,
            )
        )
    return tuple(jobs)
