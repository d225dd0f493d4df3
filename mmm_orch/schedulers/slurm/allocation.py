"""The Slurm job this process runs in (`salloc`, or a batch script's step), from the variables
Slurm sets: its id, its compressed node list, its CPUs per node and, since 23.02, its end."""

from __future__ import annotations

from collections.abc import Mapping

from mmm_orch.schedulers.allocation import Allocation, cpus_said, ends_at, expand_hostlist


def allocation(env: Mapping[str, str]) -> Allocation:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    return Allocation(
        "slurm",
        env["SLURM_JOB_ID"],
        tuple(expand_hostlist(nodelist)),
        *cpus_said("SLURM_JOB_CPUS_PER_NODE", env.get("SLURM_JOB_CPUS_PER_NODE", "")),
        ends_at(env, "SLURM_JOB_END_TIME"),
    )
