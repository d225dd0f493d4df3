"""One module per scheduler (PSI/J style). Output parsers are pure functions, tested on recorded
outputs; the submit/query/cancel verbs build on them."""

from __future__ import annotations

from mmm_orch.errors import MmmError
from mmm_orch.hosts.transport import LocalRunner, Runner
from mmm_orch.schedulers.base import Scheduler


def scheduler_for(kind: str, commands: dict[str, str], runner: Runner | None = None) -> Scheduler:
    """The scheduler module for a profile's `scheduler.kind`, with the profile's command names.
    Each module is imported when its kind is asked for: the local one brings psutil (~12 ms of a
    start-up, 2-core host, 2026-11-26), slurm and pbs ~1 ms each."""
    runner = runner or LocalRunner()
    if kind == "slurm":
        from mmm_orch.schedulers.slurm import SlurmScheduler

        return SlurmScheduler(commands, runner)
    if kind == "pbs":
        from mmm_orch.schedulers.pbs import PbsScheduler

        return PbsScheduler(commands, runner)
    if kind == "local":
        from mmm_orch.schedulers.local import LocalScheduler

        return LocalScheduler()
    raise MmmError(f"scheduler kind {kind!r} is not supported: expected slurm, pbs or local")
