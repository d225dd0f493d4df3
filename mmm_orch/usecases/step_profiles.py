"""Where the step time went: a run's torch.profiler traces (`--profile torch`) summarized per
rank and step (reporting/trace_summary.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import PROFILE_DIR
from mmm_orch.records.db import JobDB
from mmm_orch.reporting.trace_summary import PARTS as PARTS
from mmm_orch.reporting.trace_summary import RankProfile, TraceError, read, spread, traces
from mmm_orch.usecases.following import run_dir


@dataclass(frozen=True)
class Profile:
    where: Path  # the traces' directory
    ranks: list[RankProfile]  # by rank
    slowest: tuple[RankProfile, float] | None  # the slowest rank and its lag (a fraction)


def profile(db: JobDB | None, target: str, rank: int | None = None) -> Profile:
    """The summary of the profiled ranks of the run `target` names (a job or a run directory),
    or of `rank` alone."""
    where = run_dir(db, target) / PROFILE_DIR
    found = traces(where)
    if not found:
        others = sorted(path.name for path in where.iterdir()) if where.is_dir() else []
        if others:  # a facility profiler's reports: its own viewer reads them
            raise MmmError(
                f"{where}: no torch.profiler traces, but a profiler's files: "
                f"{', '.join(others[:8])}{' ...' if len(others) > 8 else ''} (open them with its "
                "viewer: nsys-ui, Perfetto; `mmm-orch profile` reads --profile torch's traces)"
            )
        raise MmmError(
            f"{where}: no traces (a run profiles with --profile torch, or --set profile=torch)"
        )
    if rank is not None and rank not in found:
        raise MmmError(f"--rank {rank}: not profiled; the traces are of ranks {sorted(found)}")
    try:
        ranks = [
            read(found[number][1], number, found[number][0])
            for number in ([rank] if rank is not None else sorted(found))
        ]
    except TraceError as exc:
        raise MmmError(str(exc)) from None
    return Profile(where, ranks, spread(ranks))
