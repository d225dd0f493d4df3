"""The one small job state machine every native scheduler state maps onto."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import shown
from mmm_orch.walltime import duration


class JobState(str, enum.Enum):
    WAITING = "waiting"  # in the backlog: recorded, to be submitted when the queue admits it
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
_RANK = {
    JobState.UNKNOWN: 0,
    JobState.WAITING: 0,
    JobState.SUBMITTING: 0,
    JobState.PENDING: 1,
    JobState.RUNNING: 2,
}


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
    partition or a QOS): its bounds (None: the server sets none, or states one that could not
    be read), its job-count limits as (jobs, per user|project, counts any|queued|running|
    eligible; None: one could not be read), a routing queue's destinations, and what the
    server stated that could not be read, as (field, the value shown; field "" for the whole
    queue)."""

    name: str
    kind: str
    min_nodes: int | None = None
    max_nodes: int | None = None
    max_walltime: int | None = None
    limits: frozenset[tuple[int, str, str]] | None = frozenset()
    destinations: tuple[str, ...] = ()
    unreadable: tuple[tuple[str, str], ...] = ()


# A count or bound a scheduler states has at most this many digits: below SQLite's largest
# integer and Python's limit on reading one (a 5,000-digit value is a ValueError in int()).
MOST_DIGITS = 18
# A walltime a scheduler states ("1-00:00:00") is never longer than this.
MOST_WALLTIME_CHARS = 32


def stated_count(value: object) -> int:
    """A whole number, 0 or more, as a scheduler states it: a JSON integer, or a text of ASCII
    digits (str.isdigit also takes '²' and Arabic-Indic digits, which a scheduler never
    writes), at most MOST_DIGITS of them. ValueError for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**MOST_DIGITS:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= MOST_DIGITS:
        return int(value)
    raise ValueError("not a whole number")


def stated_walltime(value: object) -> int:
    """Seconds of a walltime as a scheduler states it ([D-]HH:MM[:SS], ASCII). ValueError for
    anything else."""
    if isinstance(value, str) and value.isascii() and len(value) <= MOST_WALLTIME_CHARS:
        seconds = duration(value)
        if seconds is not None:
            return int(seconds)
    raise ValueError("not a walltime")


T = TypeVar("T")


class Reading:
    """A queue's values read one by one, each that cannot be kept as (field, the value shown)."""

    def __init__(self) -> None:
        self.unreadable: list[tuple[str, str]] = []

    def read(self, field: str, value: Any, reader: Callable[[Any], T]) -> T | None:
        """`reader(value)`; None where the value is absent (None) or `reader` refuses it."""
        if value is None:
            return None
        try:
            return reader(value)
        except ValueError:
            self.unreadable.append((field, shown(value)))
            return None
