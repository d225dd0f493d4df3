"""The report's figures, as PNG files: scaling (throughput and efficiency against nodes), loss
curves, step-time distributions, dist_check's all-reduce latency and bus bandwidth, and one job's
curves (`mmm-orch plot`). matplotlib with the Agg backend (no display); imported only here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator  # noqa: E402

from mmm_orch.reporting.data import JobData  # noqa: E402
from mmm_orch.reporting.table import Row  # noqa: E402

if TYPE_CHECKING:  # matplotlib.typing is 3.8's; the plot extra takes 3.7
    from matplotlib.typing import ColorType

SIZE = (8.0, 4.5)  # inches; at DPI, 1200 x 675 pixels: a terminal image viewer and a paper
DPI = 150
plt.rcParams.update({"font.size": 10, "axes.grid": True, "grid.alpha": 0.3})


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _nodes_axis(ax, nodes: list[int]) -> None:
    """Node counts on a log2 axis, ticked at the counts themselves."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(nodes))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.set_xlabel("nodes")


def _series(table: list[Row], jobs: list[JobData]) -> dict[str, list[Row]]:
    """Rows grouped by their values other than nodes: one line per group, in node order."""
    groups: dict[str, list[Row]] = {}
    for data, r in zip(jobs, table, strict=True):
        rest = ", ".join(f"{k}={v}" for k, v in data.values.items() if k != "nodes")
        groups.setdefault(rest or "all points", []).append(r)
    return {k: sorted(v, key=lambda r: r.nodes) for k, v in groups.items()}


def scaling(table: list[Row], jobs: list[JobData], path: Path) -> Path | None:
    series = {k: [r for r in v if r.throughput] for k, v in _series(table, jobs).items()}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    unit = next(r.unit for v in series.values() for r in v)
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE)
    nodes = [r.nodes for v in series.values() for r in v]
    for name, rows in series.items():
        x = [r.nodes for r in rows]
        left.plot(x, [r.throughput for r in rows], marker="o", label=name)
        right.plot(x, [r.weak for r in rows], marker="o", label=f"weak ({name})")
        right.plot(
            x, [r.strong for r in rows], marker="s", linestyle="--", label=f"strong ({name})"
        )
    right.axhline(1.0, color="grey", linewidth=1, linestyle=":", label="ideal")
    left.set_title("throughput per device")
    left.set_ylabel(f"{unit} per device")
    left.set_ylim(bottom=0)
    right.set_title("scaling efficiency vs the smallest point")
    right.set_ylabel("efficiency (1.0 = ideal)")
    right.set_ylim(0, max(1.1, max((r.weak or 0) for v in series.values() for r in v) * 1.1))
    for ax in (left, right):
        _nodes_axis(ax, nodes)
        ax.legend(fontsize=8)
    return _save(fig, path)


def losses(jobs: list[JobData], path: Path) -> Path | None:
    drawn = [d for d in jobs if any("loss" in s for s in d.steps)]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=SIZE)
    for data in drawn:
        points = [(s["step"], s["loss"]) for s in data.steps if "loss" in s]
        (line,) = ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            label=f"job {data.record.id}: {data.label}",
        )
        _validation(ax, data, line.get_color())
    ax.set_title("training loss (dashed: validation)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _validation(ax, data: JobData, color: ColorType) -> None:
    """The job's validation losses, where it has any, dashed in its training curve's color."""
    points = [(s["step"], s["val_loss"]) for s in data.steps if "val_loss" in s]
    if points:
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            linestyle="--",
            marker="o",
            markersize=3,
            color=color,
        )


def step_times(jobs: list[JobData], path: Path) -> Path | None:
    drawn = [d for d in jobs if len(d.steps) > 1]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=SIZE)
    boxes = ax.boxplot(
        [[1000 * s["dt"] for s in d.steps[1:] if "dt" in s] for d in drawn],
        showfliers=True,
        patch_artist=True,
    )
    for box in boxes["boxes"]:
        box.set_facecolor("tab:blue")
        box.set_alpha(0.6)
    ax.set_xticks(
        range(1, len(drawn) + 1), [d.label for d in drawn], rotation=20, ha="right", fontsize=8
    )
    ax.set_title("step time per point (first step left out)")
    ax.set_ylabel("step time (ms)")
    return _save(fig, path)


def allreduce(jobs: list[JobData], path: Path) -> Path | None:
    drawn = [d for d in jobs if d.allreduce]
    if not drawn:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE)
    for data in drawn:
        results = sorted(data.allreduce, key=lambda r: r["bytes"])
        x = [r["bytes"] for r in results]
        name = f"{data.label} ({data.record.ranks} ranks)"
        left.plot(x, [r["latency_us"] for r in results], marker="o", label=name)
        right.plot(x, [r["busbw_gbps"] for r in results], marker="o", label=name)
    left.set_title("all-reduce latency")
    left.set_ylabel("latency (µs)")
    left.set_yscale("log")
    right.set_title("all-reduce bus bandwidth")
    right.set_ylabel("bus bandwidth (GB/s)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _bytes(x)))
        ax.set_xlabel("message size")
        ax.legend(fontsize=8)
    return _save(fig, path)


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g} TiB"


def job_curves(data: JobData, path: Path) -> Path | None:
    """One job: loss and per-device throughput against the step."""
    if not data.steps:
        return None
    unit = next((k for k in ("tokens_per_s", "samples_per_s") if k in data.steps[-1]), "")
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE)
    steps = [s["step"] for s in data.steps]
    (line,) = left.plot(steps, [s.get("loss") for s in data.steps])
    _validation(left, data, line.get_color())
    left.set_title("training loss (dashed: validation)")
    left.set_xlabel("step")
    left.set_ylabel("loss")
    if unit:
        right.plot(steps, [s.get(unit) for s in data.steps], color="tab:orange")
        right.set_ylabel(f"{unit.replace('_per_s', '/s')} per device")
    else:
        right.plot(steps, [1000 * s.get("dt", 0) for s in data.steps], color="tab:orange")
        right.set_ylabel("step time (ms)")
    right.set_title("throughput")
    right.set_xlabel("step")
    fig.suptitle(
        f"job {data.record.id}: {data.record.workload} on {data.record.machine}, {data.label}",
        fontsize=10,
    )
    return _save(fig, path)


def report_figures(table: list[Row], jobs: list[JobData], out: Path) -> list[Path]:
    drawn = [
        scaling(table, jobs, out / "scaling.png"),
        losses(jobs, out / "loss.png"),
        step_times(jobs, out / "step_time.png"),
        allreduce(jobs, out / "allreduce.png"),
    ]
    return [p for p in drawn if p is not None]
