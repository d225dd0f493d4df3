"""Slurm: sbatch, squeue, sacct, scontrol, scancel, salloc (scheduler.py over parse.py), the
#SBATCH script (slurm.sh.j2), the job's variables (allocation.py), partitions and QOS against a
profile (drift.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from mmm_orch.schedulers import SchedulerKind

if TYPE_CHECKING:
    from mmm_orch.hosts.transport import Runner
    from mmm_orch.schedulers.allocation import Allocation
    from mmm_orch.schedulers.drift import ProfileQueue
    from mmm_orch.schedulers.slurm.scheduler import SlurmScheduler
    from mmm_orch.schedulers.states import LiveQueue


def _scheduler(commands: dict[str, str], runner: Runner) -> SlurmScheduler:
    from mmm_orch.schedulers.slurm.scheduler import SlurmScheduler

    return SlurmScheduler(commands, runner)


def _allocation(env: Mapping[str, str]) -> Allocation:
    from mmm_orch.schedulers.slurm.allocation import allocation

    return allocation(env)


def _drift(queues: Sequence[ProfileQueue], live: list[LiveQueue]) -> list[str]:
    from mmm_orch.schedulers.slurm.drift import differences

    return differences(queues, live)


KIND = SchedulerKind(
    name="slurm",
    scheduler=_scheduler,
    job_id_variable="SLURM_JOB_ID",
    allocation=_allocation,
    drift=_drift,
)
