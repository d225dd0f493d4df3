"""PBS Pro and OpenPBS: qsub, qstat, qselect, qdel, qsub -I (scheduler.py over parse.py), the
#PBS script (pbs.sh.j2), the job's variables and node file (allocation.py), queues and routing
tiers against a profile (drift.py)."""

from __future__ import annotations

from mmm_orch.schedulers import SchedulerKind

KIND = SchedulerKind(
    name="pbs",
    scheduler="scheduler:PbsScheduler",
    job_id_variable="PBS_JOBID",
    allocation="allocation:allocation",
    drift="drift:differences",
)
