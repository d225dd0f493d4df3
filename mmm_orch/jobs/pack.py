"""Many runs in one allocation (`sweep --within`): a sweep's points run side by side on the nodes
of the allocation this process runs in, as they free up, the largest point first, then in
order (a smaller one takes nodes a larger one cannot use yet). Each point is an ordinary job of
the sweep's group, run by the local executor's supervisor on its own nodes and held by this
process, as `launch` runs one; a point that fails or hangs ends alone and frees its nodes for
the next. The facilities' recipe: one background launch per node subset, then `wait`
(../shared/reference/queue-rules.md, "Many runs in one allocation")."""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

from mmm_orch.jobs.record import JobRecord

# Between two looks at the running points: short next to any run, cheap (a file read each).
POLL_S = 0.3


class Sized(Protocol):
    index: int

    @property
    def nodes(self) -> int: ...


def order(points: Sequence[Sized]) -> list[Sized]:
    """The order points are offered nodes in: the largest first, then as listed."""
    return sorted(points, key=lambda point: (-point.nodes, point.index))


def walltime_for(points: Sequence[Any], nodes: int) -> int:
    """Seconds that run every point (jobs/sweeps.Point) on `nodes` nodes: the waves they take at
    most (their nodes over the allocation's), each as long as the longest point's walltime."""
    waves = -(-sum(point.nodes for point in points) // nodes)
    return max(point.plan.queue.walltime for point in points) * waves


def next_fit(waiting: list[Sized], free: list[str]) -> tuple[Sized, tuple[str, ...]] | None:
    """The first waiting point that fits the free nodes, and the nodes it takes (the first
    free ones, in the allocation's order)."""
    for point in waiting:
        if point.nodes <= len(free):
            return point, tuple(free[:point.nodes])
    return None


def run(points: Sequence[Sized], pool: Sequence[str],
        start: Callable[[Sized, tuple[str, ...]], JobRecord],
        ended: Callable[[list[JobRecord]], list[JobRecord]],
        stop: Callable[[list[JobRecord]], None],
        never_started: Callable[[list[Sized]], None] = lambda points: None,
        in_time: Callable[[Sized], bool] = lambda point: True) -> list[JobRecord]:
    """Run every point on `pool`'s nodes: `start` records and starts one on the nodes given,
    `ended` returns those of the running records that have ended, `stop` cancels the running
    ones when this is interrupted. A waiting point the allocation has no time left for
    (`in_time`), and every waiting point when this is interrupted, goes to `never_started`.
    The records of the points that started, in the order they did."""
    waiting, free = order(points), list(pool)
    running: dict[int, tuple[JobRecord, tuple[str, ...]]] = {}
    started: list[JobRecord] = []
    try:
        while waiting or running:
            if late := [point for point in waiting if not in_time(point)]:
                waiting = [point for point in waiting if point not in late]
                never_started(late)
            while (fit := next_fit(waiting, free)) is not None:
                point, nodes = fit
                waiting.remove(point)
                free = [node for node in free if node not in nodes]
                record = start(point, nodes)
                running[record.id] = (record, nodes)
                started.append(record)
            for record in ended([held for held, _ in running.values()]):
                _, nodes = running.pop(record.id)
                free = [node for node in pool if node in free or node in nodes]
            if waiting or running:
                time.sleep(POLL_S)
    except BaseException:
        stop([held for held, _ in running.values()])
        if waiting:
            never_started(waiting)
        raise
    return started
