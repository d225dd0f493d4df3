"""How a kind's drift reader (schedulers/<kind>/drift.py) says where a profile's queues differ
from the scheduler's live configuration, alike for every kind: node and walltime bounds, job
limits, and what the server states that cannot be read. Where the server sets no bound, there is
nothing to differ from; where it states one that cannot be read (not a number, a walltime, a
list of limits as the scheduler writes them), that is a difference of its own: the check never
says "match" over it. Names come from the scheduler: each is shown escaped (a line break or a
terminal escape in one would forge or hide a line of the answer).

The profile's queues are read as they are shaped (config/queues.py), without importing the
profiles: config/ imports the registry of kinds, never the other way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import one_line
from mmm_orch.schedulers.states import LiveQueue
from mmm_orch.walltime import format_walltime


class Bounds(Protocol):
    """A profile's queue or tier (config.queues.Queue, Tier): its name and bounds."""

    @property
    def name(self) -> str: ...
    @property
    def min_nodes(self) -> int: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def max_walltime(self) -> int: ...


class Limit(Protocol):
    """A profile's job limit (config.queues.JobLimit)."""

    @property
    def jobs(self) -> int: ...
    @property
    def per(self) -> str: ...
    @property
    def counts(self) -> str: ...
    def words(self) -> str: ...


class QueueShape(Bounds, Protocol):
    """A profile's queue (config.queues.Queue): its bounds, job limits and routing tiers."""

    @property
    def job_limits(self) -> Sequence[Limit]: ...
    @property
    def tiers(self) -> Sequence[Bounds]: ...


@dataclass(frozen=True)
class ProfileQueue:
    """A profile's queue as a drift reader compares it: the queue, and the directives a job in
    it is submitted with (the queue's own, else the scheduler's queue directive)."""

    queue: QueueShape
    directives: tuple[str, ...]


def bounds(where: str, queue: Bounds, server: LiveQueue) -> list[str]:
    out = []
    if server.min_nodes is not None and server.min_nodes != queue.min_nodes:
        out.append(
            f"{where}: min_nodes {queue.min_nodes} in the profile, {server.min_nodes} on the server"
        )
    if server.max_nodes is not None and server.max_nodes != queue.max_nodes:
        out.append(
            f"{where}: max_nodes {queue.max_nodes} in the profile, {server.max_nodes} on the server"
        )
    if server.max_walltime is not None and server.max_walltime != queue.max_walltime:
        out.append(
            f"{where}: max_walltime {format_walltime(queue.max_walltime)} in the profile, "
            f"{format_walltime(server.max_walltime)} on the server"
        )
    return out


def limits(
    where: str, queue: QueueShape, server: frozenset[tuple[int, str, str]] | None
) -> list[str]:
    if server is None:  # one could not be read: said by unreadable
        return []
    profile = {(limit.jobs, limit.per, limit.counts): limit for limit in queue.job_limits}
    out = [
        f"{where}: job limit {limit.words()} in the profile, not on the server"
        for key, limit in profile.items()
        if key not in server
    ]
    for jobs, per, counts in sorted(server - set(profile)):
        out.append(
            f"{where}: job limit of {jobs} ({counts}, per {per}) on the server, not in the profile"
        )
    return out


def unreadable(kind: str, server: LiveQueue) -> list[str]:
    """What the scheduler states of `server` that could not be read: `kind name.field: value`."""
    name = one_line(server.name)
    return [
        f"could not read {kind} {name}{'.' + field if field else ''}: {value}"
        for field, value in server.unreadable
    ]


def whole_unreadable(server: LiveQueue) -> bool:
    return any(field == "" for field, _ in server.unreadable)


def names(found: Sequence[str]) -> str:
    return ", ".join(one_line(name) for name in found)
