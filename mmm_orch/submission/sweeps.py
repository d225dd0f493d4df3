"""Sweeps: one workload over the cross product of node counts and trainer options, each point an
ordinary job in one sweep group. Every point is planned (and so validated) before the first is
submitted; a refused submission cancels the points already submitted."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any

from mmm_orch.config.registry import load_workload
from mmm_orch.errors import InvalidValue, MmmError, QueueFull
from mmm_orch.planning import Plan, Request, resolve, verification
from mmm_orch.planning.occupancy import NOTHING_YET
from mmm_orch.records.db import JobDB, open_db
from mmm_orch.records.record import PACK_INDEX, JobRecord
from mmm_orch.schedulers.states import JobState
from mmm_orch.submission.submit import cancel, submit

_SPLIT = re.compile(r"(?<!\\),")  # a value may hold a comma written as \,
# Points in one sweep: a scaling study or a search is tens to hundreds of jobs; past this a
# typo (a stray value list) would submit more jobs than any allocation runs.
MAX_POINTS = 1000
# One swept value: the longest a path option can be (PATH_MAX); a longer one is a pasted blob.
MAX_VALUE = 4096
_NODES = re.compile(r"[0-9]{1,7}")  # ASCII digits: int() also reads '١'; no machine has 10^7 nodes


@dataclasses.dataclass(frozen=True)
class Point:
    index: int  # from 1, in submission order
    values: dict[str, Any]  # nodes and each swept option
    plan: Plan

    @property
    def nodes(self) -> int:
        """The nodes the point holds (its spares too)."""
        return self.plan.layout.nodes + self.plan.placement.spare_nodes

    @property
    def devices(self) -> int:
        """The devices of one node the point holds; 0: whole nodes."""
        share = self.plan.devices.share
        return len(share.held) if share else 0

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


# The sweep's own axes, not trainer options: a point's size, in whole nodes or in devices of
# one node (runs packed side by side); both given, the points take each size of either.
SIZES = ("nodes", "devices")


def axes(nodes: str | None, sets: list[str], devices: str | None = None) -> dict[str, list[str]]:
    """The swept values: `--nodes 1,2,4`, `--devices 1,2` and each `--set KEY=V1,V2` (a single
    value is a fixed option, an axis of one). Empty lists and repeated values are refused."""
    found: dict[str, list[str]] = {}
    if nodes is not None:
        found["nodes"] = _node_counts("--nodes", _values("--nodes", nodes))
    if devices is not None:
        found["devices"] = _node_counts("--devices", _values("--devices", devices))
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise MmmError(f"--set {item!r} is invalid: give KEY=V1,V2,...")
        if key in found or key == "devices":
            raise MmmError(
                f"--set {key}: given twice; list all its values in one --set"
                if key in found
                else "--set devices: give --devices D1,D2,..."
            )
        found[key] = _values(f"--set {key}", text, allow_empty_value=True)
        if key == "nodes":  # a sweep's own axis, as --nodes is, not a trainer option
            _node_counts("--set nodes", found[key])
    count = max(1, sum(len(found.get(size, ())) for size in SIZES))
    for key, values in found.items():
        count *= 1 if key in SIZES else len(values)
    if count > MAX_POINTS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in found.items())
        raise MmmError(
            f"sweep: {sizes} is {count} points, more than {MAX_POINTS}; split it into "
            "smaller sweeps"
        )
    return found


def _node_counts(flag: str, values: list[str]) -> list[str]:
    what = "device" if flag == "--devices" else "node"
    for value in values:
        if not _NODES.fullmatch(value) or int(value) < 1:
            raise MmmError(
                f"{flag} {value[:40]!r} is invalid: {what} counts are whole numbers 1-9999999"
            )
    return values


def _values(flag: str, text: str, allow_empty_value: bool = False) -> list[str]:
    values = [v.replace("\\,", ",").strip() for v in _SPLIT.split(text, maxsplit=MAX_POINTS)]
    if len(values) > MAX_POINTS:
        raise MmmError(
            f"{flag}: more than {MAX_POINTS} values; a sweep has at most {MAX_POINTS} points"
        )
    if not text.strip() or (not allow_empty_value and any(v == "" for v in values)):
        raise MmmError(
            f"{flag} {text[:200]!r} is invalid: a comma-separated list of values, none empty"
        )
    longest = max(values, key=len)
    if len(longest) > MAX_VALUE:
        raise MmmError(
            f"{flag} {longest[:40]!r}...: a value of {len(longest)} characters; values "
            f"are at most {MAX_VALUE}"
        )
    return values


def _check_distinct(swept: dict[str, list[str]], workload: str) -> None:
    """Two spellings of one value (1 and 01, true and True, 0.1 and 1e-1) would run the same
    point twice: compared as the values the trainer gets."""
    options = load_workload(workload).options
    for key, values in swept.items():
        seen: dict[Any, str] = {}
        for value in values:
            try:
                typed = int(value) if key in SIZES else options[key].coerce(key, value)
            except (KeyError, ValueError):
                continue  # planning the point says what is wrong with it
            if typed in seen:
                flag = f"--{key}" if key in SIZES else f"--set {key}"
                raise MmmError(
                    f"{flag}: {seen[typed]!r} and {value!r} are the same value "
                    f"({typed!r}); list each value once"
                )
            seen[typed] = value


def points(request: Request, swept: dict[str, list[str]], new_jobs: bool = True) -> list[Point]:
    """Every point planned, in order (nodes outermost); the first that cannot be planned stops
    the sweep with an error naming it. Each point's queue counts the points before it against
    the queue's job limits (`new_jobs`: they are scheduler jobs, not runs in one allocation)."""
    _check_distinct(swept, request.workload)
    keys = [key for key in swept if key not in SIZES]
    sizes = [{size: value} for size in SIZES for value in swept.get(size, ())] or [{}]
    out = []
    load = request.queue_load or NOTHING_YET
    # Sizes outermost, then the --set values' combinations, as product(sizes, *sets) orders them.
    for index, (size, combo) in enumerate(
        itertools.product(sizes, itertools.product(*(swept[k] for k in keys))), start=1
    ):
        values = {**size, **dict(zip(keys, combo, strict=True))}
        point_request = dataclasses.replace(
            request,
            options=request.options + tuple((k, v) for k, v in values.items() if k not in SIZES),
            queue_load=load,
            nodes=int(values["nodes"]) if "nodes" in values else request.nodes,
            devices=int(values["devices"]) if "devices" in values else request.devices,
        )
        try:
            plan = verification.where_wanted(resolve(point_request), request.verify)
        except MmmError as exc:
            label = " ".join(f"{k}={v if v.isprintable() else repr(v)}" for k, v in values.items())
            said = f"sweep point {index} ({label}): {exc}"
            if isinstance(exc, InvalidValue):  # (the API's callers catch it by its class)
                raise InvalidValue(exc.field, exc.value, exc.allowed, said) from None
            raise (QueueFull if isinstance(exc, QueueFull) else MmmError)(said) from None
        if plan.queue.name and new_jobs:
            load = load.adding(plan.queue.name, 1)
        out.append(
            Point(
                index,
                {"nodes": plan.layout.nodes, **{k: v for k, v in values.items() if k != "nodes"}},
                plan,
            )
        )
    if not out:
        raise MmmError("sweep: no points; give --nodes N1,N2,... and/or --set KEY=V1,V2,...")
    return out


def submit_sweep(
    swept: dict[str, list[str]],
    planned: list[Point],
    db_file: Path,
    template: str | None = None,
    remote: str = "",
    backlog: bool = False,
) -> tuple[int, list[JobRecord]]:
    """Submit the points as one sweep group; a refused point cancels those already submitted.
    `backlog`: recorded waiting, for the backlog's mover to submit."""
    db = open_db(str(db_file), create=True)
    sweep_id = new_sweep(db, swept, planned, remote)
    records: list[JobRecord] = []
    try:
        for point in planned:
            records.append(
                submit(
                    point.plan,
                    db_file,
                    template,
                    remote,
                    links={"group_id": sweep_id, "group_index": point.index},
                    backlog=backlog,
                )
            )
    except BaseException:
        for record in reversed(records):
            cancel(db, record)
        raise
    return sweep_id, records


def new_sweep(
    db: JobDB,
    swept: dict[str, list[str]],
    planned: list[Point],
    remote: str = "",
    within: str = "",
    pack: dict[str, Any] | None = None,
) -> int:
    """The sweep's group: its axes and points (`within`: the allocation they run in together;
    `pack`: the template its job renders them with, and their plans are kept, which it runs)."""
    first = planned[0].plan
    return db.groups.new(
        "sweep",
        {
            "machine": first.machine,
            "workload": first.workload,
            "axes": swept,
            "points": [p.values for p in planned],
            "remote": remote,
            **({"within": within} if within else {}),
            **({"pack": pack} if pack is not None else {}),
        },
        [p.plan.to_dict() for p in planned] if pack is not None else [],
    )


def pack_job(db: JobDB, group: dict) -> JobRecord | None:
    """The job a packed sweep's points run in (None: the sweep is not a pack)."""
    if "pack" not in group["spec"]:
        return None
    return next(
        (job for job in db.list(group_id=group["id"]) if job.group_index == PACK_INDEX), None
    )


def _stored_point(point: Any) -> bool:
    """A point as submit_sweep writes it: a node count and the swept values as typed."""
    return (
        isinstance(point, dict)
        and all(
            isinstance(v, str) and len(v) <= MAX_VALUE for k, v in point.items() if k != "nodes"
        )
        and type(point.get("nodes")) is int
        and point["nodes"] >= 1
    )


def recorded_points(group: dict) -> list[dict[str, Any]]:
    """The values of every point of the sweep, as submit_sweep stored them."""
    points = group["spec"].get("points")
    if not (
        isinstance(points, list)
        and len(points) <= MAX_POINTS
        and all(_stored_point(p) for p in points)
    ):
        raise MmmError(
            f"sweep {group['id']}'s points in the job database are damaged (not the "
            "list of values per point mmm-orch writes): it was changed by hand"
        )
    return points


def stored_points(group: dict, jobs: list[JobRecord]) -> list[dict[str, Any]]:
    """The values of each job's point, as submit_sweep stored them: anything else (edited by
    hand) is refused, not shown as some other point's values."""
    points = recorded_points(group)
    out = []
    for job in jobs:
        index = job.group_index
        if not (isinstance(index, int) and 1 <= index <= len(points)):
            raise MmmError(
                f"job {job.id} of sweep {group['id']} is damaged in the job database: "
                f"point {index} of {len(points)} (changed by hand)"
            )
        out.append(points[index - 1])
    return out


def sweep_jobs(db: JobDB | None, sweep_id: int) -> tuple[dict, list[JobRecord]]:
    """The sweep group and its jobs in point order, or an error naming the sweeps there are."""
    group = db.groups.get(sweep_id) if db is not None else None
    if db is None or group is None or group["kind"] != "sweep":
        raise MmmError(
            f"sweep {sweep_id} not found"
            + (f" in {db.path}" if db is not None else "; no jobs recorded yet")
        )
    # An index edited by hand (text, none) sorts first; stored_points names it. A pack's own
    # job is no point.
    jobs = sorted(
        (
            job
            for job in db.list(group_id=sweep_id)
            if not ("pack" in group["spec"] and job.group_index == PACK_INDEX)
        ),
        key=lambda r: r.group_index if type(r.group_index) is int else -1,
    )
    return group, jobs


def members(db: JobDB | None, sweep_id: int) -> list[JobRecord]:
    """Every job of a sweep: a pack's own job first, then the points in order."""
    group, points = sweep_jobs(db, sweep_id)
    assert db is not None  # sweep_jobs found the sweep in it
    pack = pack_job(db, group)
    return ([pack] if pack is not None else []) + points


def summary(group: dict, jobs: list[JobRecord]) -> dict[str, Any]:
    """A sweep as one line of `status`: the state of its least finished point, and a count of
    its points by state."""
    pack = next(
        (job for job in jobs if "pack" in group["spec"] and job.group_index == PACK_INDEX), None
    )
    jobs = [job for job in jobs if job is not pack]
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state.value] = counts.get(job.state.value, 0) + 1
    states = set(counts)
    nodes = sorted({job.nodes for job in jobs})
    if pack is not None:
        # Points are recorded as they start; those the pack job ended before never will be.
        planned = [
            point
            for point in group["spec"].get("points") or ()
            if isinstance(point, dict) and type(point.get("nodes")) is int
        ]
        nodes = sorted({point["nodes"] for point in planned})
        if (waiting := len(planned) - len(jobs)) > 0:
            later = JobState.NOT_STARTED.value if pack.terminal else "waiting"
            counts[later] = waiting
            states.add(later if pack.terminal else pack.state.value)
    order = [
        JobState.SUBMITTING,
        JobState.RUNNING,
        JobState.PENDING,
        JobState.WAITING,
        JobState.UNKNOWN,
        JobState.FAILED,
        JobState.HUNG,
        JobState.TIMEOUT,
        JobState.CANCELLED,
        JobState.NOT_STARTED,
        JobState.COMPLETED,
    ]
    state = next((s for s in order if s.value in states), JobState.COMPLETED)
    counted = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    note = (
        f"pack job {pack.id} ({pack.state.value}): {counted}"
        if pack is not None
        else f"{len(jobs)} points, nodes {','.join(map(str, nodes))}: {counted}"
    )
    return {
        "state": state,
        "note": note,
        "nodes": nodes,
        "elapsed": max((job.elapsed() or 0 for job in jobs), default=0) or None,
    }
