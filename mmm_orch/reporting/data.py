"""What a report reads of each job: its record, the step records of its run's metrics.jsonl, its
startup markers and, for dist_check, the all-reduce timings it printed."""

from __future__ import annotations

import contextlib
import json
import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.injob.protocol import DIST_CHECK_JSON, METRICS_FILE, PROFILE_DIR
from mmm_orch.planning.store import section
from mmm_orch.progress.logs import head_and_tail
from mmm_orch.progress.startup import NO_STEPS, parse_markers
from mmm_orch.records.record import JobRecord
from mmm_orch.reporting.trace_summary import mean_shares

MAX_METRICS_LINE = 1 << 16  # a step record is a few hundred bytes
# A step record is ~250 bytes: 64 MiB or 500,000 lines is a quarter million steps and more, read
# in a few seconds. Past either a report reads no further (its note says so): time and memory stay
# bounded whatever is in the run directory.
MAX_METRICS_BYTES = 64 << 20
MAX_METRICS_LINES = 500_000
_CHUNK = 2 << 20  # few reads (SSH round trips for a remote job); its lines are held at once


@dataclass
class JobData:
    record: JobRecord
    values: dict[str, Any]  # what tells this job from the others: nodes, options
    steps: list[dict] = field(default_factory=list)  # {"step", "dt", "loss", ...} in order
    allreduce: list[dict] = field(default_factory=list)  # {"bytes", "latency_us", "busbw_gbps"}
    startup_s: float | None = None
    profile: dict[str, float] | None = None  # mean share of step time by part (--profile torch)
    left_out: str = ""  # what of its metrics.jsonl was not read, in words ("" = nothing)

    @property
    def label(self) -> str:
        nodes = self.values.get("nodes", self.record.nodes)
        rest = ", ".join(f"{k}={v}" for k, v in self.values.items() if k != "nodes")
        return f"{nodes} node{'s' if nodes != 1 else ''}" + (f", {rest}" if rest else "")


def collect(records: list[JobRecord], values: list[dict[str, Any]] | None = None) -> list[JobData]:
    """Read each job (here, or on its login host); `values` are the sweep points' values."""
    out = []
    for i, record in enumerate(records):
        mesh = section(record.plan, "layout").get("mesh") or {}
        if not (isinstance(mesh, dict) and all(type(v) is int for v in mesh.values())):
            raise MmmError(
                f"job {record.id}'s plan in the job database is damaged (its mesh is "
                "not the axis sizes mmm-orch writes): it was changed by hand"
            )
        host = host_for(record.remote)
        try:  # its start and end: the markers and dist_check's line are there, however long it is
            log = head_and_tail(host, record.log_path) or ""
        except (MmmError, OSError):
            log = ""
        data = JobData(record, dict(values[i]) if values else {"nodes": record.nodes})
        data.startup_s = parse_markers(log).startup_s
        data.allreduce = allreduce_results(log)
        if record.run_dir:
            path = posixpath.join(record.run_dir, METRICS_FILE)
            reader = StepReader()
            cut = reader.read(host, path)
            data.steps = reader.steps()
            data.left_out = reader.left_out(path, cut)
            if not record.remote:  # traces are read here only (they may be hundreds of MB)
                data.profile = mean_shares(Path(record.run_dir) / PROFILE_DIR)
        out.append(data)
    return out


def notes(jobs: list[JobData]) -> str:
    """What was left out of the jobs' metrics, and which jobs have none, one line each (""
    when nothing was)."""
    told = [f"job {d.record.id}: {d.left_out}" for d in jobs if d.left_out]
    lines = (
        ["mmm-orch: note: metrics left out of the figures and table: " + "; ".join(told)]
        if told
        else []
    )
    stepless = [
        str(d.record.id)
        for d in jobs
        if not d.steps and not d.allreduce and d.record.state.terminal
    ]
    if stepless:
        lines.append(
            f"mmm-orch: note: job{'s' if len(stepless) > 1 else ''} "
            f"{', '.join(stepless)}: {NO_STEPS}"
        )
    return "\n".join(lines)


def _number(value: Any) -> bool:
    """A finite number a float holds (JSON's integers have no bound: 400 digits are no metric)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < 1e300 if isinstance(value, int) else math.isfinite(value)


class StepReader:
    """The step records of a metrics.jsonl, each step once (the last record of a step wins: a
    resumed run re-ran it). A line that is not a record mmm-orch writes (cut short, foreign, not
    JSON, longer than MAX_METRICS_LINE) is skipped and counted; so is a field of a step record
    that is no finite number (the NaN loss of a diverged run, a value as text)."""

    def __init__(self) -> None:
        self._steps: dict[int, dict] = {}
        self.lines = 0
        self.skipped = 0
        self.first_skipped = 0  # its line number
        self.values_dropped = 0

    def read(self, host, path: str) -> bool:
        """Read the file in chunks, holding at most one chunk of it; True when it is longer than
        MAX_METRICS_BYTES or MAX_METRICS_LINES (the rest is not read). A missing file, or one that is not a regular
        file (a FIFO, a directory), reads as no records."""
        offset, pending = 0, b""
        while offset < MAX_METRICS_BYTES:
            try:
                chunk = host.read_from(path, offset, min(_CHUNK, MAX_METRICS_BYTES - offset))
            except (MmmError, OSError):
                chunk = None
            if not chunk:
                break
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if self.lines == MAX_METRICS_LINES:
                    return True
                self.add(line)
            pending = pending[: MAX_METRICS_LINE + 1]  # an endless line is skipped, not held
        if pending and self.lines < MAX_METRICS_LINES:
            self.add(pending)
        if offset < MAX_METRICS_BYTES:
            return False
        try:
            return bool(host.read_from(path, offset, 1))
        except (MmmError, OSError):
            return False

    def add(self, line: bytes) -> None:
        self.lines += 1
        if not line.strip():
            return
        record = None
        if len(line) <= MAX_METRICS_LINE:
            with contextlib.suppress(ValueError, RecursionError):
                record = json.loads(line)
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("event"), str)
            or (record["event"] == "step" and type(record.get("step")) is not int)
        ):
            self.skipped += 1
            self.first_skipped = self.first_skipped or self.lines
            return
        if record["event"] == "step":
            self._steps[record["step"]] = {
                "event": "step",
                **{k: v for k, v in record.items() if _number(v)},
            }
            # None is no value (mem_gib without a GPU); anything else that is no number is noted.
            self.values_dropped += sum(
                1 for k, v in record.items() if k != "event" and v is not None and not _number(v)
            )

    def steps(self) -> list[dict]:
        return [self._steps[k] for k in sorted(self._steps)]

    def left_out(self, path: str, cut: bool) -> str:
        parts = []
        if self.skipped:
            parts.append(
                f"{self.skipped} line{'s' if self.skipped > 1 else ''} of {path} that "
                f"{'are' if self.skipped > 1 else 'is'} no step record (cut short, not a "
                f"JSON object, over {MAX_METRICS_LINE >> 10} KiB; first: line "
                f"{self.first_skipped})"
            )
        if self.values_dropped:
            many = self.values_dropped > 1
            parts.append(
                f"{self.values_dropped} value{'s' if many else ''} of step records that "
                f"{'are' if many else 'is'} no finite number (NaN, text, nested)"
            )
        if cut:
            parts.append(
                f"all past its first {MAX_METRICS_BYTES >> 20} MiB or {MAX_METRICS_LINES:,} lines"
            )
        return ", ".join(parts)


def allreduce_results(log: str) -> list[dict]:
    """dist_check's timings from its JSON line (rank 0 prints it once; a launcher may put the
    rank in front of it)."""
    for line in log.splitlines():
        if DIST_CHECK_JSON in line:
            try:
                found = json.loads(line.split(DIST_CHECK_JSON, 1)[1]).get("allreduce", [])
            except (ValueError, AttributeError, RecursionError):
                return []
            keys = ("bytes", "latency_us", "busbw_gbps")
            return (
                [r for r in found if isinstance(r, dict) and all(_number(r.get(k)) for k in keys)]
                if isinstance(found, list)
                else []
            )
    return []
