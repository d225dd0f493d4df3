"""Where a step's time went, from a rank's torch.profiler trace (Chrome JSON, written by
runtime/profiling.py): pure functions of the trace's events, no torch.

A step is the span of its `mmm:step#N` range on the thread that ran it. Its time is split, with
nothing counted twice and nothing left over:
- the pipeline's bubble: a point-to-point transfer (a stage's send or receive) in flight while
  nothing computes, the stage waiting on its neighbour;
- exposed communication: another collective in flight (gloo's threads, NCCL/RCCL/oneCCL
  kernels, the c10d calls and waits) while nothing computes (the main thread's other operators
  on CPU, the device's other kernels where the trace has them);
- the rest of the step by the range it falls in: data, forward, backward, optimizer (the step's
  named ranges), and idle (in none of them).
Communication hidden behind compute is the collectives' time while something computed; with the
exposed part it makes the collectives' whole time.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmm_orch.errors import shown
from mmm_orch.injob.protocol import PROFILE_PHASES, PROFILE_RANGE, PROFILE_TRACE
from mmm_orch.paths import NotReadable, read_regular

COLLECTIVE = re.compile(
    r"gloo:|nccl|rccl|ccl:|c10d::|_c10d_functional::|record_param_comms|wait", re.I
)
POINT_TO_POINT = re.compile(r"send|recv", re.I)  # of the collectives: a pipeline's transfers
STEP = re.compile(re.escape(PROFILE_RANGE) + r"step#([0-9]{1,15})$")  # no run has more steps
TOP = 10

Span = tuple[float, float]  # (start, end) in microseconds


class TraceError(ValueError):
    """A file that is not a torch.profiler trace with mmm-orch's step ranges."""


@dataclass(frozen=True)
class StepShares:
    step: int
    total_ms: float
    parts_ms: dict[str, float]  # data, forward, backward, optimizer, exposed_comm, idle
    comm_ms: float  # the collectives' whole time in the step
    hidden_comm_ms: float  # of which while something computed

    def share(self, part: str) -> float:
        return self.parts_ms[part] / self.total_ms if self.total_ms else 0.0


@dataclass(frozen=True)
class RankProfile:
    rank: int
    host: str
    steps: list[StepShares]
    top_ops: list[tuple[str, float]] = field(default_factory=list)  # (name, ms), inclusive
    top_collectives: list[tuple[str, float]] = field(default_factory=list)
    top_kernels: list[tuple[str, float]] = field(default_factory=list)  # a device's, if traced

    @property
    def mean_step_ms(self) -> float:
        return sum(s.total_ms for s in self.steps) / len(self.steps)

    def mean_share(self, part: str) -> float:
        total = sum(s.total_ms for s in self.steps)
        return sum(s.parts_ms[part] for s in self.steps) / total if total else 0.0


PARTS = (*PROFILE_PHASES, "bubble", "exposed_comm", "idle")


def rank_profile(trace: dict[str, Any], rank: int, host: str) -> RankProfile:
    """The window's steps of one rank's trace, each split as the module says."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise TraceError("not a Chrome trace (no traceEvents list)")
    # A CUDA trace repeats each range on the GPU's stream (gpu_user_annotation, from the first
    # kernel to the last one launched in it); the CPU's is the one the step clock times.
    spans = [
        _timed(e)
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and "dur" in e
        and e.get("cat") != "gpu_user_annotation"
    ]
    steps = [(int(m[1]), e) for e in spans if (m := STEP.match(str(e.get("name", ""))))]
    if not steps:
        raise TraceError(f"no {PROFILE_RANGE}step#N ranges: not a trace of an mmm-orch window")
    main = steps[0][1].get("tid")
    kernels = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    comm = [e for e in spans if COLLECTIVE.search(str(e.get("name", "")))]
    transfers = _union([_span(e) for e in comm if POINT_TO_POINT.search(str(e["name"]))])
    if kernels:  # the device's timeline says what computed
        compute = [_span(e) for e in kernels if not COLLECTIVE.search(str(e["name"]))]
    else:
        compute = [
            _span(e)
            for e in spans
            if e.get("tid") == main
            and e.get("cat") == "cpu_op"
            and not COLLECTIVE.search(str(e.get("name", "")))
        ]
    phases = {
        name: _union(
            [
                _span(e)
                for e in spans
                if e.get("name") == PROFILE_RANGE + name and e.get("tid") == main
            ]
        )
        for name in PROFILE_PHASES
    }
    covered = _union([s for name in PROFILE_PHASES for s in phases[name]])
    comm_u, compute_u = _union([_span(e) for e in comm]), _union(compute)
    out = []
    for number, event in sorted(steps, key=lambda pair: pair[0]):
        step = [_span(event)]
        in_flight = _intersect(comm_u, step)
        exposed = _subtract(in_flight, compute_u)
        rest = _subtract(step, exposed)
        parts = {name: _length(_intersect(phases[name], rest)) for name in PROFILE_PHASES}
        bubble = _length(_intersect(exposed, transfers))
        parts["bubble"] = bubble
        parts["exposed_comm"] = _length(exposed) - bubble
        parts["idle"] = _length(_subtract(rest, covered))
        out.append(
            StepShares(
                number,
                _length(step) / 1000,
                {name: value / 1000 for name, value in parts.items()},
                _length(in_flight) / 1000,
                _length(_intersect(in_flight, compute_u)) / 1000,
            )
        )
    window = (min(s[1]["ts"] for s in steps), max(s[1]["ts"] + s[1]["dur"] for s in steps))
    inside = [e for e in spans if window[0] <= e.get("ts", -1) <= window[1]]
    return RankProfile(
        rank,
        host,
        out,
        _top(
            e for e in inside if e.get("cat") == "cpu_op" and not COLLECTIVE.search(str(e["name"]))
        ),
        _top(e for e in inside if COLLECTIVE.search(str(e.get("name", "")))),
        _top(e for e in inside if e.get("cat") == "kernel"),
    )


MAX_TRACE_BYTES = 4 << 30  # a GPU trace of a few steps is tens to hundreds of MB
MAX_MICROSECONDS = 2**53  # 285 years: a trace's clock (epoch microseconds) stays below


def traces(where: Path) -> dict[int, tuple[str, Path]]:
    """The traces in a run's profile directory, by rank: (host, file)."""
    found = {}
    for file in sorted(where.glob("*.pt.trace.json")):
        named = PROFILE_TRACE.fullmatch(file.name)
        if named and len(named["rank"]) <= 9:  # no run has a billion ranks
            found[int(named["rank"])] = (named["host"], file)
    return found


def read(file: Path, rank: int, host: str) -> RankProfile:
    """A trace file's profile; TraceError for one that is not a regular file (a FIFO, a
    device, a directory), too large, not JSON, nested past reading, or not a window's."""
    try:
        data = read_regular(file, MAX_TRACE_BYTES)
    except NotReadable as exc:
        raise TraceError(
            f"{exc}; a trace is a regular file of at most "
            f"{MAX_TRACE_BYTES >> 30} GiB (profile fewer steps)"
        ) from None
    except OSError as exc:
        raise TraceError(f"{file}: cannot read: {exc.strerror}") from None
    try:
        return rank_profile(json.loads(data), rank, host)
    except RecursionError:
        raise TraceError(f"{file}: nested too deeply to be a Chrome trace") from None
    except (ValueError, TraceError) as exc:
        raise TraceError(f"{file}: {exc}") from None


def mean_shares(where: Path) -> dict[str, float] | None:
    """The profiled ranks' mean share of step time in each part (the report's columns), or
    None where the run has no readable traces."""
    try:
        profiles = [read(file, rank, host) for rank, (host, file) in traces(where).items()]
    except (OSError, TraceError):
        return None
    if not profiles:
        return None
    return {part: sum(p.mean_share(part) for p in profiles) / len(profiles) for part in PARTS}


def spread(ranks: list[RankProfile]) -> tuple[RankProfile, float] | None:
    """The slowest rank and how much longer its mean step is than the fastest's (a fraction);
    None for fewer than two ranks."""
    if len(ranks) < 2:
        return None
    slowest = max(ranks, key=lambda r: r.mean_step_ms)
    fastest = min(r.mean_step_ms for r in ranks)
    return slowest, (slowest.mean_step_ms - fastest) / fastest if fastest else 0.0


def _top(events) -> list[tuple[str, float]]:
    total: dict[str, float] = defaultdict(float)
    for event in events:
        total[str(event["name"])] += event["dur"] / 1000
    return sorted(total.items(), key=lambda item: -item[1])[:TOP]


def _timed(event: dict[str, Any]) -> dict[str, Any]:
    """A span event whose `ts` and `dur` are numbers of microseconds a clock can hold, `dur`
    not negative; TraceError naming the event otherwise."""
    for key in ("ts", "dur"):
        value = event.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or abs(value) > MAX_MICROSECONDS  # first: a 400-digit int is no float
            or math.isnan(value)
        ):
            raise TraceError(
                f"event {shown(event.get('name'))}: {key} {shown(value)} is not a number of "
                f"microseconds (at most {MAX_MICROSECONDS})"
            )
    if event["dur"] < 0:
        raise TraceError(f"event {shown(event.get('name'))}: dur {event['dur']} is negative")
    return event


def _span(event: dict[str, Any]) -> Span:
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def _union(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: list[Span], b: list[Span]) -> list[Span]:
    """Both unions (sorted, disjoint): where they overlap."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(a: list[Span], b: list[Span]) -> list[Span]:
    """`a` less `b` (both unions)."""
    out = []
    for start, end in a:
        for cut_start, cut_end in b:
            if cut_start >= end:
                break  # `b` is sorted: the rest lie past this span
            if cut_end <= start:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def _length(spans: list[Span]) -> float:
    return sum(end - start for start, end in spans)
