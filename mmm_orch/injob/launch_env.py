"""Rank, local rank and world size from whichever launcher started this process. Pure: no torch.

Launchers are tried in order; the first one whose rank variable is set wins. torchrun comes first
because torchrun started under srun or mpiexec inherits their variables, which then describe the
torchrun agent, not this worker.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    launcher: str
    master_addr: str
    master_port: int


# (launcher, rank var, size var, local rank vars in order of preference, local size vars)
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",)),
    (
        "pals",
        "PALS_RANKID",
        "PMI_SIZE",
        ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"),
        ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
    ),
    (
        "pmi",
        "PMI_RANK",
        "PMI_SIZE",
        ("PMI_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID"),
        ("PMI_LOCAL_SIZE", "MPI_LOCALNRANKS"),
    ),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    (
        "pmix",
        "PMIX_RANK",
        "PMIX_SIZE",
        ("PMIX_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMIX_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",), ("SLURM_NTASKS_PER_NODE",)),
)
DEFAULT_PORT = 29500


class LaunchEnvError(RuntimeError):
    pass


def _int(env: Mapping[str, str], name: str, launcher: str) -> int:
    value = env.get(name, "")
    try:
        return int(value.split("(")[0].split(",")[0])  # SLURM_NTASKS_PER_NODE may read "2(x2)"
    except ValueError:
        raise LaunchEnvError(f"{launcher}: {name}={value!r} is not an integer") from None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if env.get(name, "") != ""), None)


def host_name(env: Mapping[str, str] | None = None) -> str:
    """This node's name as the job knows it: Slurm's name for it (a test cluster's nodes share
    one host), else the host's."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()


@dataclass(frozen=True)
class Place:
    """Where this process stands in the launch, as its launcher's variables say."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int


def detect(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """The launch environment; a single process when no launcher variables are set at all."""
    env = os.environ if env is None else env
    return _with_rendezvous(env, locate(env))


def locate(env: Mapping[str, str]) -> Place:
    """This process's rank, local rank and sizes (LaunchEnvError where the variables say none
    that makes sense), without the rendezvous the process group needs besides."""
    for launcher, rank_var, size_var, local_vars, local_size_vars in _LAUNCHERS:
        if env.get(rank_var, "") == "":
            continue
        if env.get(size_var, "") == "":
            raise LaunchEnvError(
                f"{launcher} launch: {rank_var} is set but {size_var} is not; cannot tell the "
                "world size"
            )
        rank, world = _int(env, rank_var, launcher), _int(env, size_var, launcher)
        local_var = _first(env, local_vars)
        if local_var is None and world > 1:
            raise LaunchEnvError(
                f"{launcher} launch: none of {', '.join(local_vars)} is set; cannot tell the "
                "local rank (and so the device)"
            )
        local_rank = _int(env, local_var, launcher) if local_var else 0
        local_size_var = _first(env, local_size_vars)
        local_world = _int(env, local_size_var, launcher) if local_size_var else None
        if not 0 <= rank < world:
            raise LaunchEnvError(f"{launcher} launch: {rank_var}={rank} outside 0..{world - 1}")
        return Place(launcher, rank, local_rank, world, local_world or world)
    for size_var in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        if env.get(size_var, "") not in ("", "1"):
            raise LaunchEnvError(
                f"{size_var}={env[size_var]} but no rank variable is set (RANK, PMI_RANK, "
                "PALS_RANKID, OMPI_COMM_WORLD_RANK, PMIX_RANK or SLURM_PROCID)"
            )
    return Place("none", 0, 0, 1, 1)


def _with_rendezvous(env: Mapping[str, str], place: Place) -> LaunchEnv:
    addr = env.get("MASTER_ADDR", "")
    if not addr:
        if place.world_size > place.local_world_size:
            raise LaunchEnvError(
                f"MASTER_ADDR is not set and the {place.world_size} ranks span several nodes; the "
                "job script sets it to the first node (see the machine profile's rendezvous)"
            )
        addr = "127.0.0.1"
    port = env.get("MASTER_PORT", "") or str(DEFAULT_PORT)
    if not (port.isascii() and port.isdigit()):  # ("²" is a digit to isdigit, not to int)
        raise LaunchEnvError(f"MASTER_PORT={port!r} is not a port number")
    return LaunchEnv(
        rank=place.rank,
        local_rank=place.local_rank,
        world_size=place.world_size,
        local_world_size=place.local_world_size,
        launcher=place.launcher,
        master_addr=addr,
        master_port=int(port),
    )
