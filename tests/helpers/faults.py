"""Fault injection on the one-host test clusters, where every "node" is this host: the rank
processes of a job on one node, found by their environment, and signals to them. Used by the
failover tests and benchmarks/failover.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

# A trainer of two ranks or more in which rank 1 stops at step 4: every other rank waits in the
# all-reduce, nothing dies, nothing is printed. For the watchdog's hang tests.
HANG = """import time
import torch
import torch.distributed as dist
from mmm_orch.runtime import dist as runtime_dist

rt = runtime_dist.setup()
for step in range(1, 1000):
    if step == 4 and rt.rank == 1:
        time.sleep(3600)  # this rank stops; every other rank waits in the all-reduce below
    value = torch.ones(1)
    dist.all_reduce(value)
    if rt.rank == 0:
        print(f"step={step} loss={1 / step:.3f}", flush=True)
    time.sleep(0.1)
"""


def _ranks_of(native_id: str, module: str = "mmm_orch.trainers."):
    """(pid, environment) of each rank process of the job's launch on this host: the rank itself
    (python -m mmm_orch.trainers.X, or another `module`), not the launcher whose command line
    holds the same words (srun and mpiexec on the job's first node)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = dict(item.split("=", 1) for item in
                       (entry / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in item)
        except OSError:
            continue
        if len(argv) < 3 or argv[1] != b"-m" or not argv[2].startswith(module.encode()):
            continue
        if (env.get("SLURM_JOB_ID") or env.get("PBS_JOBID")) == native_id:
            yield int(entry.name), env


def trainer_pids(native_id: str, node: str, module: str = "mmm_orch.trainers.") -> list[int]:
    """The rank processes of the job's launch on `node` (one host plays every node: Slurm's
    slurmd says which node in SLURMD_NODENAME, Hydra in MPIR_CVAR_CH3_INTERFACE_HOSTNAME)."""
    return [pid for pid, env in _ranks_of(native_id, module)
            if (env.get("SLURMD_NODENAME") or env.get("MPIR_CVAR_CH3_INTERFACE_HOSTNAME")) == node]


def rank_pids(native_id: str, ranks: set[int]) -> list[int]:
    """The processes of these global ranks (a launch without a host file names no node)."""
    return [pid for pid, env in _ranks_of(native_id)
            if int(env.get("SLURM_PROCID") or env.get("PMI_RANK") or -1) in ranks]


def kill(pids: list[int], signum: int) -> float:
    assert pids, "no such rank process"
    for pid in pids:
        os.kill(pid, signum)
    return time.time()


def signal_node(native_id: str, node: str, signum: int, module: str = "mmm_orch.trainers.") -> float:
    pids = trainer_pids(native_id, node, module)
    assert pids, f"no rank of job {native_id} on {node}"
    return kill(pids, signum)
