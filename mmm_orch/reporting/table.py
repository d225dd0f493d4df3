"""One row per job: size, layout, step time, throughput, MFU, startup, final loss, and scaling
efficiency against the smallest point with the same other values (DEFINITIONS says how)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from mmm_orch.planning.store import section
from mmm_orch.reporting.data import JobData

DEFINITIONS = (
    "Step time: the median over every step but the first (warm-up). Throughput: the median "
    "per-device tokens/s (else samples/s) over the same steps. Efficiency is against the point "
    "with the fewest ranks and the same other values; 1.0 is ideal. Weak scaling (work per "
    "device fixed, as with a per-rank batch): step_time(base) / step_time. Strong scaling "
    "(total work fixed): step_time(base) x ranks(base) / (step_time x ranks). Charged: what the "
    "job was charged (node-hours, from the scheduler's nodes and elapsed time at the machine's "
    "charge factors); per node-hour: the job's throughput (per-device median x ranks) over an "
    "hour, divided by the node-hours the job was charged per hour it ran."
)
COLUMNS = [
    ("job", "job"),
    ("point", "point"),
    ("nodes", "nodes"),
    ("ranks", "ranks"),
    ("mesh", "mesh"),
    ("state", "state"),
    ("steps", "steps"),
    ("step_ms", "step ms"),
    ("throughput", "per device"),
    ("mfu", "MFU %"),
    ("startup_s", "startup s"),
    ("final_loss", "final loss"),
    ("val_loss", "val loss"),
    ("comm_pct", "exposed comm %"),
    ("bubble_pct", "bubble %"),
    ("data_pct", "data %"),
    ("weak", "weak eff"),
    ("strong", "strong eff"),
    ("charged", "node-h charged"),
    ("per_node_hour", "per node-hour"),
    ("latency_us", "lat us (min size)"),
    ("busbw_gbps", "busbw GB/s (max size)"),
]


@dataclass
class Row:
    job: int
    point: str
    nodes: int
    ranks: int
    mesh: str
    state: str
    steps: int | None
    step_ms: float | None
    throughput: float | None
    unit: str  # tokens/s or samples/s, per device
    mfu: float | None
    startup_s: float | None
    final_loss: float | None
    val_loss: float | None = None  # the last validation (trainers with --eval-every)
    weak: float | None = None
    strong: float | None = None
    latency_us: float | None = None
    busbw_gbps: float | None = None
    charged: float | None = None  # node-hours (the machine's unit), once the job ended
    per_node_hour: float | None = None  # tokens (samples) per node-hour charged
    # Of the profiled steps' time (--profile torch): collectives nothing hid, data loading.
    comm_pct: float | None = None
    bubble_pct: float | None = None  # a pipeline's (none without one)
    data_pct: float | None = None


def _median(values: list) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def row(data: JobData) -> Row:
    record, steps = data.record, data.steps
    timed = steps[1:] if len(steps) > 1 else steps
    unit = next(
        (key for key in ("tokens_per_s", "samples_per_s") if any(key in s for s in timed)), ""
    )
    dt = _median([s.get("dt") for s in timed])
    sizes = sorted(data.allreduce, key=lambda r: r["bytes"])
    mesh = section(record.plan, "layout").get("mesh") or {}
    out = Row(
        job=record.id,
        point=data.label,
        nodes=record.nodes,
        ranks=record.ranks,
        mesh=" ".join(f"{k}={v}" for k, v in mesh.items() if v != 1) or "-",
        state=record.state.value,
        steps=len(steps) or None,
        step_ms=None if dt is None else 1000 * dt,
        throughput=_median([s.get(unit) for s in timed]) if unit else None,
        unit=unit.replace("_per_s", "/s"),
        mfu=_median([s.get("mfu") for s in timed]),
        startup_s=data.startup_s,
        final_loss=steps[-1].get("loss") if steps else None,
        val_loss=next((s["val_loss"] for s in reversed(steps) if "val_loss" in s), None),
        latency_us=sizes[0]["latency_us"] if sizes else None,
        busbw_gbps=sizes[-1]["busbw_gbps"] if sizes else None,
        charged=record.charge,
        comm_pct=None if data.profile is None else 100 * data.profile["exposed_comm"],
        bubble_pct=100 * data.profile["bubble"]
        if data.profile and data.profile["bubble"]
        else None,
        data_pct=None if data.profile is None else 100 * data.profile["data"],
    )
    if out.throughput and record.charge and record.charged_seconds:
        charged_per_hour = record.charge / (record.charged_seconds / 3600)
        out.per_node_hour = out.throughput * record.ranks * 3600 / charged_per_hour
    return out


def rows(jobs: list[JobData]) -> list[Row]:
    """Rows with efficiencies: each against the point with the fewest ranks among those that
    share its other values (a sweep over nodes and batch size compares within a batch size)."""
    out = [row(data) for data in jobs]
    groups: dict[tuple, list[Row]] = {}
    for data, r in zip(jobs, out, strict=True):
        key = tuple(sorted((k, str(v)) for k, v in data.values.items() if k != "nodes"))
        groups.setdefault(key, []).append(r)
    for members in groups.values():
        timed = [(r, r.step_ms) for r in members if r.step_ms]
        if not timed:
            continue
        base, base_ms = min(timed, key=lambda pair: (pair[0].ranks, pair[0].job))
        for r, ms in timed:
            r.weak = base_ms / ms
            r.strong = base_ms * base.ranks / (ms * r.ranks)
    return out


def cell(r: Row, key: str) -> str:
    value = getattr(r, key)
    if value is None:
        return "-"
    if key == "throughput":
        return f"{value:,.1f} {r.unit}"
    if key == "per_node_hour":
        return f"{value:,.0f} {r.unit.removesuffix('/s')}"
    if key == "charged":
        return f"{value:.4f}" if value < 1 else f"{value:,.2f}"
    if key in ("weak", "strong", "final_loss", "val_loss"):
        return f"{value:.3f}" if key in ("final_loss", "val_loss") else f"{value:.2f}"
    if key in ("comm_pct", "bubble_pct", "data_pct"):
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def shown_columns(table: list[Row]) -> list[tuple[str, str]]:
    """The columns with a value in some row (a dist_check sweep has no loss, a trainer sweep no
    all-reduce timings)."""
    return [(k, h) for k, h in COLUMNS if any(cell(r, k) != "-" for r in table)]


def text(table: list[Row]) -> str:
    columns = shown_columns(table)
    cells = [[h for _, h in columns]] + [[cell(r, k) for k, _ in columns] for r in table]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return (
        "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            for line in cells
        )
        + "\n"
    )


def as_dicts(table: list[Row]) -> list[dict]:
    return [asdict(r) for r in table]
