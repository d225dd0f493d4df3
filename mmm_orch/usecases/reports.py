"""The use cases that compare runs (`mmm-orch report`, `plot`, the Python API's report): which
jobs a report covers, chosen one way for the CLI and the API (a sweep's points with the values
they were run with, or jobs by id), the report built from their logs and metrics, and one job's
curves drawn. Returns values and files; printing is the caller's."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import METRICS_FILE
from mmm_orch.records.db import JobDB
from mmm_orch.records.record import JobRecord
from mmm_orch.reporting import build, data, table
from mmm_orch.submission import sweeps
from mmm_orch.usecases.following import job

Report = build.Report


@dataclass(frozen=True)
class Targets:
    """The jobs a report covers, each with the values it was run with, what to call the report
    and where it goes unless told."""

    records: list[JobRecord]
    values: list[dict[str, Any]]
    title: str
    default_out: str


def targets(db: JobDB | None, asked: list[tuple[str, int]]) -> Targets:
    """The jobs of `asked`: ("sweep", id) for a sweep's points (a pack's as they started), or
    ("job", id)."""
    records: list[JobRecord] = []
    values: list[dict[str, Any]] = []
    names = []
    for kind, number in asked:
        if kind == "sweep":
            if db is None:
                raise MmmError(f"sweep {number} not found: no jobs recorded yet")
            group, points = sweeps.sweep_jobs(db, number)
            values += sweeps.stored_points(group, points)
            records += [db.get(point.id, events=False) or point for point in points]  # with plans
            names.append(f"s{number}")
        else:
            record = job(db, number)
            records.append(record)
            values.append({"nodes": record.nodes})
            names.append(str(number))
    default = "report-" + (
        "-".join(names)
        if all(n.startswith("s") for n in names)
        else "jobs-" + "-".join(n.lstrip("s") for n in names)
    )
    title = ", ".join(f"sweep {n[1:]}" if n.startswith("s") else f"job {n}" for n in names)
    return Targets(records, values, title, default[:100])


def of_records(records: list[JobRecord]) -> Targets:
    """Jobs given as records (the Python API's Jobs, from any database)."""
    return Targets(
        records,
        [{"nodes": r.nodes} for r in records],
        ", ".join(f"job {r.id}" for r in records),
        "report-jobs-" + "-".join(str(r.id) for r in records),
    )


def report(chosen: Targets, out: str | Path | None) -> Report:
    """The report's rows; with `out`, its figures and report.html written there (whole or not
    at all)."""
    return build.report(
        chosen.records, chosen.values, None if out is None else Path(out), chosen.title
    )


def rows(made: Report) -> list[dict[str, Any]]:
    return table.as_dicts(made.rows)


def text(made: Report) -> str:
    return table.text(made.rows)


def notes(made: Report) -> str:
    """What the report left out and why ("" when nothing)."""
    return data.notes(made.jobs)


def plot(db: JobDB | None, job_id: int, out: str | None) -> tuple[Path, str]:
    """One job's loss and throughput curves as a PNG file (`out`, else job-<id>.png); the file,
    and what was left out and why."""
    if importlib.util.find_spec("matplotlib") is None:
        raise MmmError(build.PLOT_HINT)
    record = job(db, job_id)
    path = Path(out or f"job-{record.id}.png")
    # plot writes one PNG file (report writes a directory): --out names that file.
    if path.is_dir() or not path.name or (path.exists() and not path.is_file()):
        raise MmmError(
            f"--out {str(path)!r}: is not a file; plot writes one PNG file: name it, "
            f"e.g. job-{record.id}.png"
        )
    if path.suffix.lower() != ".png":
        raise MmmError(
            f"--out {str(path)!r}: plot writes a PNG: name a file ending .png, e.g. "
            f"job-{record.id}.png"
        )
    if not path.parent.is_dir():
        raise MmmError(f"--out {str(path)!r}: no directory {str(path.parent)!r} to write it in")
    run = data.collect([record])[0]
    if not run.steps:
        raise MmmError(
            f"job {record.id} has no step metrics to plot"
            + (
                f" ({run.left_out})"
                if run.left_out
                else f" ({record.run_dir}/{METRICS_FILE} is missing or empty)"
                if record.run_dir
                else f" (workload {record.workload} writes none)"
            )
        )
    from mmm_orch.reporting import figures  # matplotlib writes its cache at import: not for a typo

    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.png")  # a failed write leaves no half PNG
    try:
        figures.job_curves(run, tmp)
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise MmmError(f"--out {str(path)!r}: cannot write: {exc.strerror}") from None
    return path, data.notes([run])
