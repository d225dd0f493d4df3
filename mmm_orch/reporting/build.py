"""A report of jobs (`mmm-orch report`, mmm_orch.report()): their rows, figures where
matplotlib is installed, and one self-contained report.html, written into a directory."""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.paths import write_whole
from mmm_orch.records.record import JobRecord
from mmm_orch.reporting import data, html, table

PLOT_HINT = (
    "figures need matplotlib: pip install 'mmm-orch[plot]' (into the environment "
    "mmm-orch runs from), then run this command again"
)


@dataclass
class Report:
    rows: list[Any]  # table.Row, one per job
    jobs: list[Any]  # data.JobData: what was read of each job
    page: Path | None  # None: nothing was written
    figures: list[Path] = field(default_factory=list)
    hint: str = ""  # why there are no figures ("" = there are)


def report(
    records: list[JobRecord], values: list[dict[str, Any]] | None, out: Path | None, title: str
) -> Report:
    """Read the jobs, and write the figures and report.html into `out` (checked first: a report
    that cannot be written writes nothing); with no `out`, only the rows."""
    jobs = data.collect(records, values)
    rows = table.rows(jobs)
    if out is None:
        return Report(rows, jobs, None)
    created = _report_dir(out)
    there = set(out.iterdir())
    figures: list[Path] = []
    hint = PLOT_HINT if importlib.util.find_spec("matplotlib") is None else ""
    try:
        try:
            if not hint:
                # matplotlib: optional, and it writes its cache when imported
                from mmm_orch.reporting import figures as draw

                figures = draw.report_figures(rows, jobs, out)
            page = html.page(f"mmm-orch report: {title}", rows, figures, table.DEFINITIONS, hint)
        except OSError as exc:
            raise MmmError(
                f"--out {str(out)!r}: cannot write the figures: {exc.strerror}"
            ) from None
        write_whole(str(out / "report.html"), page)
    except BaseException:  # a full disk, an interrupt: the report is written whole or not at all
        for path in set(out.iterdir()) - there:
            with contextlib.suppress(OSError):
                path.unlink()
        _remove_dirs(created)
        raise
    return Report(rows, jobs, out / "report.html", figures, hint)


def _report_dir(out: Path) -> list[Path]:
    """`report --out` names a directory (made when missing) that the figures and report.html go
    into: a file, a FIFO or a place that takes no files is refused before anything is written or
    printed, and a directory made for it is removed again. Returns the directories it made,
    innermost first."""
    if out.exists() and not out.is_dir():
        what = "a file" if out.is_file() else "a FIFO, socket or device"
        raise MmmError(
            f"--out {str(out)!r}: cannot make the directory: {what} is there (report "
            "writes a directory of figures and report.html; name a new or empty one)"
        )
    created = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()  # it takes files: a read-only place says so here
    except OSError as exc:
        _remove_dirs(created)
        doing = "write into" if out.is_dir() else "make"
        raise MmmError(
            f"--out {str(out)!r}: cannot {doing} the directory: {exc.strerror or exc}"
        ) from None
    return created


def _remove_dirs(created: list[Path]) -> None:
    for directory in created:  # innermost first
        with contextlib.suppress(OSError):
            directory.rmdir()
