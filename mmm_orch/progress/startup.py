"""Startup timing from job logs: when the job started, when the launch began, when the first
training step completed, when the launch ended.

Our scripts and trainers print epoch-second markers (injob/protocol.py: `job_start=`,
`launch_start=`, `first_step=`, `launch_end=`; with failover also `attempt=`, `failover: retired`
and `resumed_step=`). Logs that mmm-orch did not write are read the way the startup-time
study did (seeds/002): `Job started at: 2023-11-02-183323 on HOST` and the first timestamped line
with `step=` (DeepSpeed's `[2023-11-02 18:34:13,122] ... step=0, ...`). Both of those are in
the node's local time, so their difference is right even without a time zone.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mmm_orch.injob import protocol
from mmm_orch.limits import MAX_EPOCH

# The markers the timeline is made of (the staging markers are there for a reader of the log).
_TIMED = {
    name: protocol.ONCE[name]
    for name in ("job_start", "launch_start", "first_step", "launch_end", "walltime_stop")
}

_JOB_STARTED = re.compile(r"Job started at: (\d{4}-\d{2}-\d{2}-\d{6})(?: on (\S+))?")
_STAMPED_STEP = re.compile(
    r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?\].*\bstep=\d+"
)
_FILE_LAYOUT = re.compile(r"nhosts(\d{1,9})-ngpu(\d{1,9})")


@dataclass
class Markers:
    """Times in seconds: epoch seconds for our markers, or seconds on the log's local clock for
    logs we did not write (only differences between them are meaningful)."""

    job_start: float | None = None
    launch_start: float | None = None
    first_step: float | None = None
    launch_end: float | None = None
    launch_exit: int | None = None  # the launch's exit code, printed with launch_end
    walltime_stop: float | None = None  # the watchdog asked the trainers to save and stop
    repeated: list[tuple[float, str]] = field(default_factory=list)  # (at, what): attempts, ...
    host: str = ""
    ranks: int | None = None
    nodes: int | None = None

    @property
    def startup_s(self) -> float | None:
        """Job start (else launch start) to the end of the first training step."""
        start = self.job_start if self.job_start is not None else self.launch_start
        if start is None or self.first_step is None:
            return None
        return round(self.first_step - start, 3)  # logs stamp milliseconds at best


# What timeline and report say of a job whose program reports no steps.
NO_STEPS = (
    f"its program reported no steps (no `step=N` line, no {protocol.METRICS_FILE}), so "
    "there is no startup time or step metric to show; mmm_orch.runtime.report_step "
    "reports them (docs/runtime.md)"
)


def _local_time(text: str, layout: str) -> float | None:
    """Seconds on the log's own clock; None for a stamp that is no date (2026-13-45)."""
    try:
        return (datetime.strptime(text, layout) - datetime(1970, 1, 1)).total_seconds()
    except ValueError:
        return None


def _epoch(text: str) -> float | None:
    """A marker's time, or None past what a clock shows (a garbled or forged line)."""
    value = float(text)
    return value if value <= MAX_EPOCH else None


def parse_markers(text: str) -> Markers:
    found = Markers()
    local = Markers()  # from the seed-style lines, used where our markers are absent
    for line in text.splitlines():
        for name, pattern in _TIMED.items():
            match = pattern.search(line)
            if match and getattr(found, name) is None and _epoch(match[1]) is not None:
                setattr(found, name, _epoch(match[1]))
                if name == "job_start" and match[2]:
                    found.host = match[2]
                if name == "launch_start" and match[2]:
                    found.ranks, found.nodes = int(match[2]), int(match[3])
                if name == "launch_end" and match[2]:
                    found.launch_exit = int(match[2])
        if line.startswith(protocol.PREFIX):
            found.repeated.extend(_repeated(line))
        if local.job_start is None and (match := _JOB_STARTED.search(line)):
            local.job_start = _local_time(match[1], "%Y-%m-%d-%H%M%S")
            local.host = (match[2] or "") if local.job_start is not None else ""
        elif local.first_step is None and (match := _STAMPED_STEP.search(line)):
            stamp = _local_time(match[1], "%Y-%m-%d %H:%M:%S")
            if stamp is not None:
                local.first_step = stamp + (float(f"0.{match[2]}") if match[2] else 0.0)
    if found.job_start is None and found.launch_start is None and found.first_step is None:
        found.job_start, found.first_step = local.job_start, local.first_step
    found.host = found.host or local.host
    return found


def _repeated(line: str) -> list[tuple[float, str]]:
    if (match := protocol.REPEATED["attempt"].search(line)) and (
        at := _epoch(match[2])
    ) is not None:
        return [(at, f"attempt {match[1]} on {match[3]}")]
    if (match := protocol.REPEATED["retired"].search(line)) and (
        at := _epoch(match[2])
    ) is not None:
        return [(at, f"retired {match[1]}")]
    if (match := protocol.REPEATED["resumed"].search(line)) and (
        at := _epoch(match[1])
    ) is not None:
        return [(at, f"resumed at step {match[2]}")]
    return []


def from_file_name(name: str, markers: Markers) -> Markers:
    """Nodes and ranks from the study's log names (`...-nhosts4-ngpu16-...`) when the log has
    no launch marker."""
    match = _FILE_LAYOUT.search(name)
    if match and markers.nodes is None:
        markers.nodes, markers.ranks = int(match[1]), int(match[2])
    return markers


def timeline(
    submitted: float | None, markers: Markers, ended: float | None
) -> list[dict[str, Any]]:
    """The job's events in order, each with the gap to the one before it (failover attempts,
    retired nodes and resumes go where their times put them)."""
    known: list[tuple[str, float | None]] = [
        ("submitted", submitted),
        ("job start", markers.job_start),
        ("launch start", markers.launch_start),
        ("first step", markers.first_step),
        ("walltime stop", markers.walltime_stop),
        ("launch end", markers.launch_end),
        ("ended", ended),
    ]
    events = [(name, at) for name, at in known if at is not None]
    for at, name in markers.repeated:  # before the first fixed event that comes later
        where = next((i for i, (_, t) in enumerate(events) if t > at), len(events))
        events.insert(where, (name, at))
    rows: list[dict[str, Any]] = []
    previous: float | None = None
    for name, at in events:
        rows.append({"event": name, "at": at, "gap_s": None if previous is None else at - previous})
        previous = at
    return rows


def summarize(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Median and worst start-to-first-step per group of `keys`, over the rows that have one."""
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if row["startup_s"] is not None:
            groups.setdefault(tuple(row[k] for k in keys), []).append(row["startup_s"])
    return [
        {
            **dict(zip(keys, key, strict=True)),
            "runs": len(values),
            "median_s": statistics.median(values),
            "worst_s": max(values),
        }
        for key, values in sorted(groups.items(), key=str)
    ]
