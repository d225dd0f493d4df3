"""What a report reads of each job: its record, the step records of its run's metrics.jsonl, its
startup markers and, for dist_check, the all-reduce timings it printed."""

from __future__ import annotations

import json
import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.jobs.db import JobRecord

DIST_CHECK_JSON = "[dist_check] json "
MAX_METRICS_LINE = 1 << 16  # a step record is a few hundred bytes


@dataclass
class JobData:
    record: JobRecord
    values: dict[str, Any]                  # what tells this job from the others: nodes, options
    steps: list[dict] = field(default_factory=list)      # {"step", "dt", "loss", ...} in order
    allreduce: list[dict] = field(default_factory=list)  # {"bytes", "latency_us", "busbw_gbps"}
    startup_s: float | None = None

    @property
    def label(self) -> str:
        nodes = self.values.get("nodes", self.record.nodes)
        rest = ", ".join(f"{k}={v}" for k, v in self.values.items() if k != "nodes")
        return f"{nodes} node{'s' if nodes != 1 else ''}" + (f", {rest}" if rest else "")


def collect(records: list[JobRecord], values: list[dict[str, Any]] | None = None) -> list[JobData]:
    """Read each job (here, or on its login host); `values` are the sweep points' values."""
    from mmm_orch.hosts import host_for
    from mmm_orch.jobs.startup import parse_markers

    out = []
    for i, record in enumerate(records):
        host = host_for(record.remote)
        log = _read(host, record.log_path).decode(errors="replace")
        data = JobData(record, dict(values[i]) if values else {"nodes": record.nodes})
        data.startup_s = parse_markers(log).startup_s
        data.allreduce = allreduce_results(log)
        if record.run_dir:
            metrics = _read(host, posixpath.join(record.run_dir, "metrics.jsonl"))
            data.steps = step_records(metrics.decode(errors="replace"))
        out.append(data)
    return out


def _read(host, path: str) -> bytes:
    try:
        return host.read_from(path, 0, 1 << 30) or b""
    except (MmmError, OSError):
        return b""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def step_records(text: str) -> list[dict]:
    """The step records of a metrics.jsonl, each step once (the last record of a step wins: a
    resumed run re-ran it). A line that is not such a record (cut short, foreign, a value that is
    no finite number) is left out, and so is a field that is not a number."""
    steps: dict[int, dict] = {}
    for line in text.splitlines():
        if len(line) > MAX_METRICS_LINE:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("event") == "step" and \
                isinstance(record.get("step"), int) and not isinstance(record["step"], bool):
            steps[record["step"]] = {"event": "step", **{k: v for k, v in record.items()
                                                          if _number(v)}}
    return [steps[k] for k in sorted(steps)]


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
            return [r for r in found if isinstance(r, dict) and all(_number(r.get(k)) for k in keys)] \
                if isinstance(found, list) else []
    return []
