"""Many runs in one allocation (`sweep --within`, `sweep --pack`): a sweep's points run side by
side in the allocation this process runs in, as room frees up, the largest point first, then in
order (a smaller one takes room a larger one cannot use yet). A point holds whole nodes, or
some devices of one node (`--devices D`: the profile's devices.slots say how a node is shared).
Each point is an ordinary job of the sweep's group, run by the local executor's supervisor in
its own slot and held by this process, as `launch` runs one; a point that fails or hangs ends
alone and frees its slot for the next. The facilities' recipe: one background launch per node
subset or device, then `wait` (../shared/reference/queue-rules.md, "Many runs in one
allocation")."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mmm_orch.records.record import JobRecord

# Between two looks at the running points: short next to any run, cheap (a file read each).
POLL_S = 0.3
# A point's walltime ends this long before its allocation's (the local supervisor's grace to
# stop it, and some), and one that would run less than its walltime margin and MIN_POINT_RUN_S
# more is not started. A pack's own walltime leaves START_SLACK_S beyond its waves for this and
# for its script's start-up before the first point.
END_SLACK_S = 30
MIN_POINT_RUN_S = 60
START_SLACK_S = 60


class Sized(Protocol):
    index: int

    @property
    def nodes(self) -> int: ...

    @property
    def devices(self) -> int: ...  # of one node; 0: whole nodes


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a point runs: whole nodes, or some devices (positions) of one node."""

    nodes: tuple[str, ...]
    devices: tuple[int, ...] = ()


def _size(point: Sized, per_node: int) -> int:
    return point.devices or point.nodes * per_node


def order(points: Sequence[Sized], per_node: int = 1) -> list[Sized]:
    """The order points are offered room in: the largest first (in devices), then as listed."""
    return sorted(points, key=lambda point: (-_size(point, per_node), point.index))


def walltime_for(points: Sequence[Any], nodes: int) -> int:
    """Seconds that run every point (submission/sweeps.Point) on `nodes` nodes: the waves they take at
    most (their devices over the allocation's), each as long as the longest point's walltime,
    and the pack's start-up and the slack before its end."""
    per_node = devices_per_node(points)
    waves = -(-sum(_size(point, per_node) for point in points) // (nodes * per_node))
    return max(point.plan.queue.walltime for point in points) * waves + START_SLACK_S


def devices_per_node(points: Sequence[Any]) -> int:
    """The devices a node is shared by, for points on some of them (the profile's; their plans
    say): 1 where every point takes whole nodes."""
    return next((len(point.plan.devices.share.ids) for point in points if point.devices), 1)


class Room:
    """The allocation's nodes and which devices of each are free. A point of whole nodes takes
    nodes with every device free; a point of some devices takes them on a node already shared
    where one has room, keeping whole nodes for the points that need them."""

    def __init__(self, pool: Sequence[str], per_node: int):
        self.pool, self.per_node = list(pool), per_node
        self.free = {node: set(range(per_node)) for node in pool}

    def take(self, point: Sized) -> Slot | None:
        if point.devices:
            shared_first = sorted(self.pool, key=lambda node: len(self.free[node]) == self.per_node)
            node = next((n for n in shared_first if len(self.free[n]) >= point.devices), None)
            if node is None:
                return None
            held = tuple(sorted(self.free[node])[: point.devices])
            self.free[node] -= set(held)
            return Slot((node,), held)
        whole = [node for node in self.pool if len(self.free[node]) == self.per_node]
        if len(whole) < point.nodes:
            return None
        for node in whole[: point.nodes]:
            self.free[node] = set()
        return Slot(tuple(whole[: point.nodes]))

    def give_back(self, slot: Slot) -> None:
        for node in slot.nodes:
            self.free[node] |= set(slot.devices or range(self.per_node))


def run(
    points: Sequence[Sized],
    pool: Sequence[str],
    start: Callable[[Sized, Slot], JobRecord],
    ended: Callable[[list[JobRecord]], list[JobRecord]],
    stop: Callable[[list[JobRecord]], None],
    never_started: Callable[[list[Sized]], None] = lambda points: None,
    in_time: Callable[[Sized], bool] = lambda point: True,
    per_node: int = 1,
) -> list[JobRecord]:
    """Run every point in `pool`'s nodes (of `per_node` devices each): `start` records and starts
    one in the slot given, `ended` returns those of the running records that have ended, `stop`
    cancels the running ones when this is interrupted. A waiting point the allocation has no
    time left for (`in_time`), and every waiting point when this is interrupted, goes to
    `never_started`. The records of the points that started, in the order they did."""
    waiting, room = order(points, per_node), Room(pool, per_node)
    running: dict[int, tuple[JobRecord, Slot]] = {}
    started: list[JobRecord] = []
    try:
        while waiting or running:
            if late := [point for point in waiting if not in_time(point)]:
                waiting = [point for point in waiting if point not in late]
                never_started(late)
            for point in list(waiting):  # the first that fits, then the next that still does
                if (slot := room.take(point)) is not None:
                    waiting.remove(point)
                    record = start(point, slot)
                    running[record.id] = (record, slot)
                    started.append(record)
            for record in ended([held for held, _ in running.values()]):
                room.give_back(running.pop(record.id)[1])
            if waiting or running:
                time.sleep(POLL_S)
    except BaseException:
        stop([held for held, _ in running.values()])
        if waiting:
            never_started(waiting)
        raise
    return started
