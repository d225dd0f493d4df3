"""Rank, local rank and world size from every launcher the machine profiles generate."""

from __future__ import annotations

import pytest

from mmm_orch.injob.launch_env import LaunchEnvError, detect

CASES = [
    ("torchrun", {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                  "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, (5, 1, 8)),
    ("pals", {"PALS_RANKID": "13", "PALS_LOCAL_RANKID": "1", "PMI_RANK": "13", "PMI_SIZE": "24",
              "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "12"}, (13, 1, 24)),
    ("pmi", {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (3, 1, 4)),
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (6, 2, 8)),
    ("pmix", {"PMIX_RANK": "2", "PMIX_SIZE": "4", "PMIX_LOCAL_RANK": "0"}, (2, 0, 4)),
    ("slurm", {"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3",
               "SLURM_NTASKS_PER_NODE": "4(x2)"}, (7, 3, 8)),
]


@pytest.mark.parametrize("launcher, env, expected", CASES, ids=[c[0] for c in CASES])
def test_each_launcher(launcher, env, expected):
    found = detect({**env, "MASTER_ADDR": "x1000c0s0b0n0", "MASTER_PORT": "29400"})
    assert found.launcher == launcher
    assert (found.rank, found.local_rank, found.world_size) == expected
    assert (found.master_addr, found.master_port) == ("x1000c0s0b0n0", 29400)


def test_no_launcher_is_one_process_on_loopback():
    found = detect({})
    assert (found.rank, found.world_size, found.launcher, found.master_addr) == (0, 1, "none", "127.0.0.1")


@pytest.mark.parametrize("env, names", [
    ({"WORLD_SIZE": "4"}, ["WORLD_SIZE=4", "RANK", "PMI_RANK"]),
    ({"RANK": "1"}, ["RANK is set but WORLD_SIZE is not"]),
    ({"PMI_RANK": "1", "PMI_SIZE": "4"}, ["PMI_LOCAL_RANK", "MPI_LOCALRANKID"]),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "4"},
     ["MASTER_ADDR is not set"]),
    ({"RANK": "9", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, ["RANK=9 outside 0..3"]),
])
def test_errors_name_the_missing_variable(env, names):
    with pytest.raises(LaunchEnvError) as err:
        detect(env)
    for name in names:
        assert name in str(err.value)
