"""The one small job state machine every native scheduler state maps onto."""

from __future__ import annotations

import enum

from mmm_orch.config.dataclass_code import dataclass


class JobState(str, enum.Enum):
    SUBMITTING = "submitting"  # recorded, the scheduler asked, its answer not (yet) known
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    HUNG = "hung"  # ended by the watchdog: no step completed for too long
    NOT_STARTED = "not started"  # a packed point its allocation ended before: never ran
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.HUNG,
        JobState.NOT_STARTED,
    }
)
_RANK = {JobState.UNKNOWN: 0, JobState.SUBMITTING: 0, JobState.PENDING: 1, JobState.RUNNING: 2}


def advance(current: JobState, observed: JobState) -> JobState:
    """The state after observing `observed`: never backwards, never out of a terminal state.

    UNKNOWN (scheduler unreachable, job aged out) never overwrites what we already know.
    """
    if current.terminal or observed is JobState.UNKNOWN:
        return current
    if observed.terminal:
        return observed
    return observed if _RANK[observed] >= _RANK[current] else current


@dataclass(frozen=True)
class JobStatus:
    """What one scheduler query says about one job."""

    native_id: str
    state: JobState
    native_state: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    started_at: float | None = None  # epoch seconds, as the scheduler recorded them
    ended_at: float | None = None
    # The scheduler's own accounting of a job that ended: the nodes it held and for how long (s).
    nodes: int | None = None
    elapsed: float | None = None


@dataclass(frozen=True)
class OpenJob:
    """A job not finished, as the scheduler lists it: the names it is queued under (PBS: its
    queue; Slurm: its partition and QOS), whether it has started, whether it is the user's own
    (else a job of their project's), and the account (project) it is charged to."""

    native_id: str
    names: frozenset[str]
    running: bool
    mine: bool
    account: str


@dataclass(frozen=True)
class LiveQueue:
    """A queue as the scheduler is configured (PBS: a queue, `kind` execution or route; Slurm: a
    partition or a QOS): its bounds (None: the server sets none), its job-count limits as
    (jobs, per user|project, counts any|queued|running|eligible), a routing queue's
    destinations."""

    name: str
    kind: str
    min_nodes: int | None = None
    max_nodes: int | None = None
    max_walltime: int | None = None
    limits: frozenset[tuple[int, str, str]] = frozenset()
    destinations: tuple[str, ...] = ()
