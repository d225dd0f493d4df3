"""Slurm: sbatch, squeue, sacct, scontrol, scancel, salloc (scheduler.py over parse.py), the
#SBATCH script (slurm.sh.j2), the job's variables (allocation.py), partitions and QOS against a
profile (drift.py)."""

from __future__ import annotations

from mmm_orch.schedulers import SchedulerKind

KIND = SchedulerKind(
    name="slurm",
    scheduler="scheduler:SlurmScheduler",
    job_id_variable="SLURM_JOB_ID",
    allocation="allocation:allocation",
    drift="drift:differences",
)
