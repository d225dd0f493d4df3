"""What a user (and their project) already has in a machine's queues, and whether a job more
passes one of the facility's job-count limits (the profiles' `job_limits`). Pure: the jobs are
read from the scheduler, or from the job database when it does not answer (submission/queue_load.py),
and handed to queue selection (planning/queue_choice.py), which skips a queue the call would
overfill and says why."""

from __future__ import annotations

import dataclasses

from mmm_orch.config.machine import Machine
from mmm_orch.config.queues import JobLimit, Queue
from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import one_line
from mmm_orch.schedulers.states import OpenJob

# Jobs named in a refusal: enough to find them in `qstat`/`squeue`, not a wall of ids.
SHOWN_IDS = 5
SHOWN_QUEUES = 4


@dataclass(frozen=True)
class QueueLoad:
    """The open jobs of the user and their project on one machine, where they were read, and the
    jobs this call has already planned there (a sweep's earlier points), queue by queue."""

    jobs: tuple[OpenJob, ...]
    source: str
    planned: tuple[tuple[str, int], ...] = ()

    def adding(self, queue: str, jobs: int) -> QueueLoad:
        return dataclasses.replace(self, planned=self.planned + ((queue, jobs),))


NOTHING_YET = QueueLoad((), "nothing counted: the scheduler was not asked")


def queue_names(directives: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The names a queue's directives give a job ('-q debug' -> debug; '-p batch', '-q debug' ->
    batch and debug; '--partition=x' -> x): the values, not the flags."""
    names = set()
    for directive in directives:
        for word in directive.split():
            flag, eq, value = word.partition("=")
            if eq and flag.startswith("-"):
                names.add(value)
            elif not word.startswith("-"):
                names.add(word)
    return frozenset(names)


def holds(queue: Queue, directives: tuple[str, ...], job: OpenJob) -> bool:
    """Whether `job` counts in `queue`: it carries every name the queue's directives give (a
    QOS on a partition: both), or is in one of a routing queue's destinations (its tiers)."""
    named = queue_names(directives)
    return (bool(named) and named <= job.names) or any(
        tier.name and tier.name in job.names for tier in queue.tiers
    )


def _counted(limit: JobLimit, job: OpenJob, account: str | None) -> bool:
    if limit.per == "user" and not job.mine:
        return False
    # Without an account the scheduler charges the user's default one: their own jobs count.
    if limit.per == "project" and (job.account != account if account else not job.mine):
        return False
    return {
        "any": True,
        "queued": not job.running,
        "running": job.running,
        "eligible": not job.running,
    }[limit.counts]


def past_limit(
    machine: Machine,
    queue: Queue,
    directives: tuple[str, ...],
    load: QueueLoad,
    account: str | None,
    adding: int,
) -> str | None:
    """Why `adding` more jobs in `queue` would pass a limit the scheduler refuses at submission
    (the queue's own, then the machine's), in words; None when they fit."""
    scopes = [
        (queue.job_limits, f"queue {queue.name}", True),
        (machine.job_limits, f"{machine.name}'s queues", False),
    ]
    for limits, where, this_queue_only in scopes:
        for limit in limits:
            if not limit.refuses:
                continue
            have = [
                job
                for job in load.jobs
                if _counted(limit, job, account)
                and (not this_queue_only or holds(queue, directives, job))
            ]
            earlier = sum(
                n for name, n in load.planned if not this_queue_only or name == queue.name
            )
            if len(have) + earlier + adding > limit.jobs:
                return _over(limit, where, have, earlier, adding, load.source, account)
    return None


def _over(
    limit: JobLimit,
    where: str,
    have: list[OpenJob],
    earlier: int,
    adding: int,
    source: str,
    account: str | None,
) -> str:
    whose = (
        "you have"
        if limit.per == "user"
        else f"project {account} has"
        if account
        else "your default project has"
    )
    ids = ", ".join(one_line(job.native_id) for job in have[:SHOWN_IDS])  # the scheduler's
    more = f" and {len(have) - SHOWN_IDS} more" if len(have) > SHOWN_IDS else ""
    held = (
        f"{whose} {len(have)} there ({ids}{more}; {source})"
        if have
        else f"{whose} none there ({source})"
    )
    this = f"{earlier} planned before and {adding} more" if earlier else f"this adds {adding}"
    said = f"{where} takes {limit.words()} ({limit.source})"
    return f"{said}: {this}" if source == NOTHING_YET.source else f"{said}: {held}, {this}"


def way_out(room: list[str]) -> str:
    """What the user can do when the queue is full: a queue with room (`room`, the first few
    named), fewer jobs, or the backlog."""
    named = ", ".join(room[:SHOWN_QUEUES]) + (", ..." if len(room) > SHOWN_QUEUES else "")
    where = f"take a --queue with room ({named}), " if room else "submit "
    return (
        f"{where[0].upper()}{where[1:]}fewer jobs, or let them wait their turn with --backlog "
        "(submitted as your jobs there end)"
    )
