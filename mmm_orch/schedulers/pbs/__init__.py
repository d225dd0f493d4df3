"""PBS Pro and OpenPBS: qsub, qstat, qselect, qdel, qsub -I (scheduler.py over parse.py), the
#PBS script (pbs.sh.j2), the job's variables and node file (allocation.py), queues and routing
tiers against a profile (drift.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from mmm_orch.schedulers import SchedulerKind

if TYPE_CHECKING:
    from mmm_orch.hosts.transport import Runner
    from mmm_orch.schedulers.allocation import Allocation
    from mmm_orch.schedulers.drift import ProfileQueue
    from mmm_orch.schedulers.pbs.scheduler import PbsScheduler
    from mmm_orch.schedulers.states import LiveQueue


def _scheduler(commands: dict[str, str], runner: Runner) -> PbsScheduler:
    from mmm_orch.schedulers.pbs.scheduler import PbsScheduler

    return PbsScheduler(commands, runner)


def _allocation(env: Mapping[str, str]) -> Allocation:
    from mmm_orch.schedulers.pbs.allocation import allocation

    return allocation(env)


def _drift(queues: Sequence[ProfileQueue], live: list[LiveQueue]) -> list[str]:
    from mmm_orch.schedulers.pbs.drift import differences

    return differences(queues, live)


KIND = SchedulerKind(
    name="pbs",
    scheduler=_scheduler,
    job_id_variable="PBS_JOBID",
    allocation=_allocation,
    drift=_drift,
)
