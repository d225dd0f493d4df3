"""A machine's queues (a PBS queue, a Slurm partition or QOS): their node and walltime bounds,
a routing queue's tiers, and the facility's job-count limits in each."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from mmm_orch.config.common import (
    Bound,
    Check,
    Flag,
    NonEmptyStr,
    NonNegativeInt,
    Number,
    PositiveInt,
    Walltime,
    config,
)
from mmm_orch.limits import MAX_NODES
from mmm_orch.walltime import format_walltime

# A job's or a queue's number of nodes, as a profile states it.
NodeCount = Annotated[PositiveInt, Bound("Le", MAX_NODES)]


def _stated(text: str) -> str:
    if not text.strip():
        raise ValueError("expected where the facility states it (a page, a setting), not blank")
    return text


# Where a facility states a fact: a page or a live server's setting, never blank.
Source = Annotated[NonEmptyStr, Check(after=_stated)]


@config
class Tier:
    """An execution queue behind a routing queue, or a node-count bin with its own walltime."""

    # The execution queue's name, where it has one.
    name: str = ""
    # Its smallest job.
    min_nodes: NodeCount
    # Its largest job.
    max_nodes: NodeCount
    # Its longest walltime.
    max_walltime: Walltime

    def __post_init__(self) -> None:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes {self.min_nodes} is above max_nodes {self.max_nodes}")


# How a facility counts a user's (or a project's) jobs against a limit: `any` every job not
# finished (running, accruing or queued: PBS max_queued, Slurm MaxSubmitJobs), `queued` those
# waiting to start (PBS queued_jobs_threshold), `running` those started (PBS max_run, Slurm
# MaxJobs), `eligible` those waiting and eligible to start (OLCF's "eligible-to-run", Slurm
# MaxJobsAccrue). Past an `any` or `queued` limit the scheduler refuses the submission; past the
# others the extra jobs wait.
JobCount = Literal["any", "queued", "running", "eligible"]
REFUSED_PAST = ("any", "queued")
MAX_JOB_LIMIT = 1_000_000  # no facility lets one user queue more; a bigger number is a typo


@config
class JobLimit:
    """At most `jobs` of one user's (or one project's) jobs, counted as `counts` says."""

    # How many.
    jobs: Annotated[NonNegativeInt, Bound("Le", MAX_JOB_LIMIT)]
    # Counted for each user, or for the whole project.
    per: Literal["user", "project"]
    # Which jobs count (JobCount above).
    counts: JobCount
    source: Source  # where the facility states it (a page, or the live server's setting)

    @property
    def refuses(self) -> bool:
        """Whether the scheduler refuses a submission past it (else the job waits)."""
        return self.counts in REFUSED_PAST

    def words(self) -> str:
        kind = {
            "any": "running or queued",
            "queued": "queued",
            "running": "running",
            "eligible": "eligible to run",
        }[self.counts]
        return f"{self.jobs} {kind} job{'s' if self.jobs != 1 else ''} per {self.per}"


@config
class Queue:
    # The name --queue takes and the directive names.
    name: NonEmptyStr
    # The fewest nodes a job in it may ask for.
    min_nodes: NodeCount = 1
    # The most nodes a job in it may ask for.
    max_nodes: NodeCount
    # Its longest walltime.
    max_walltime: Walltime
    # A routing queue's execution queues, or node-count bins with walltimes of their own.
    tiers: list[Tier] = field(default_factory=list)
    # May be picked when the user gives no --queue (preemptable queues should not be).
    automatic: Flag = True
    # Needs an allocation or request first; never picked automatically.
    by_request: Flag = False
    # Overrides Scheduler.queue_directive, e.g. a debug QOS on a batch partition.
    directives: list[str] | None = None
    # What a user should know about it, in one line.
    notes: str = ""
    # The facility's job-count limits in this queue (a routing queue's count its tiers' jobs).
    job_limits: list[JobLimit] = field(default_factory=list)
    # What the facility multiplies a job's node-hours by in this queue (QOS), over the machine's
    # own factor (charging.factor); None: 1.
    charge_factor: Number | None = None

    def limits(self) -> str:
        text = f"{self.min_nodes}-{self.max_nodes} nodes, <= {format_walltime(self.max_walltime)}"
        if self.tiers:
            text += "; " + ", ".join(
                f"{t.name + ' ' if t.name else ''}{t.min_nodes}-{t.max_nodes}: "
                f"<= {format_walltime(t.max_walltime)}"
                for t in self.tiers
            )
        return text
