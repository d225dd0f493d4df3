"""`mmm-orch diagnose`: the first real failure in a log, its node and its documented fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmm_orch.config.failures import common_failures, machine_failures
from mmm_orch.injob.diagnose import diagnose
from helpers.jobs import wait_state

FIXTURES = Path(__file__).parent / "fixtures" / "failures"


def run(cli, log: str, machine: str | None = None) -> dict:
    args = ["diagnose", "--json", "--log", str(FIXTURES / log)] + (["--machine", machine] if machine else [])
    result = cli(*args)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_seed_traceback_on_aurora_names_the_error_not_the_killed_ranks(cli):
    report = run(cli, "aurora_torch_not_compiled_with_cuda_seed004.log", "aurora")
    first = report["first"]
    assert first["signature"] == "torch-not-compiled-with-cuda"
    assert (first["rank"], first["host"]) == (0, "x4512c5s2b0n0")
    assert "xccl" in first["fix"] and first["source"].startswith("seeds/004")
    assert report["fallout_lines"] == 2  # rank 6 exited, rank 11 died from signal 15


def test_seed_cuda_oom(cli):
    first = run(cli, "perlmutter_cuda_oom_seed003.log", "perlmutter")["first"]
    assert first["signature"] == "cuda-out-of-memory" and "activation checkpointing" in first["fix"]


def test_lost_node_is_the_first_failure_and_names_that_node(cli):
    report = run(cli, "aurora_node_lost_cascade.log", "aurora")
    assert report["first"]["signature"] == "pals-shepherd-killed"
    assert report["first"]["host"] == "x4305c1s6b0n0.hsn.cm.aurora.alcf.anl.gov"
    assert report["later"] == {"gloo-peer-closed": 1} and report["fallout_lines"] == 3
    # Without the machine's own signatures only generic ones apply: the gloo error comes first.
    generic = run(cli, "aurora_node_lost_cascade.log")["first"]
    assert generic["signature"] == "gloo-peer-closed" and generic["host"] == "10.115.1.4"


@pytest.mark.parametrize("machine,line,name,fix", [
    ("aurora", "x4102c5s3b0n0: MPICH ERROR: No VNIs available", "no-vnis-available", "--no-vni"),
    ("aurora", "libfabric:12:cxi: Cassini Event Queue overflow detected", "cassini-event-queue-overflow",
     "FI_CXI_DEFAULT_CQ_SIZE=131072"),
    ("aurora", "x4102c5s3b0n0: ping failed on x4305c1s6b0n0: RPC timeout", "pals-ping-failed", "resubmit"),
    ("frontier", "MIOpen(HIP): Error [Exec] sqlite: disk I/O error", "miopen-disk-io", "MIOPEN_USER_DB_PATH"),
    ("polaris", "[rank3]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)",
     "nccl-timeout-with-aws-ofi-plugin", "--preset nccl-aws-ofi-off"),
    ("perlmutter", "[rank3]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)",
     "nccl-collective-timeout", "same collectives"),
    ("perlmutter", "slurmstepd: error: *** JOB 42 ON nid001 CANCELLED AT 2026-01-01T10:00:00 DUE TO TIME LIMIT ***",
     "slurm-time-limit", "walltime"),
    ("polaris", "=>> PBS: job killed: walltime 3630 exceeded limit 3600", "pbs-walltime-exceeded", "walltime"),
    ("polaris", "scheduler: Can Never Run: Insufficient amount of resource: grand_fs", "retired-filesystem",
     "home:eagle"),
])
def test_each_documented_signature(machine, line, name, fix):
    signatures = machine_failures(machine)
    text = f"step=1 loss=3.0\n{line}\nx4102c5s3b0n0: rank 1 died from signal 15\n"
    first = diagnose(text, signatures).first
    assert first is not None and first.signature.name == name and fix in first.signature.fix
    assert first.line_number == 2 and first.signature.source


def test_a_plain_exception_is_reported_only_when_nothing_specific_matched():
    text = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad shape\n"
    result = diagnose(text, common_failures())
    assert result.first.signature.name == "python-exception" and result.first.line_number == 3


@pytest.mark.slow
def test_a_real_failing_local_job(cli, isolated, monkeypatch):
    probe = isolated / "oom_probe.py"
    probe.write_text("import os, sys\nif os.environ.get('RANK', '0') == '1':\n"
                     "    print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB',"
                     " file=sys.stderr, flush=True)\n    sys.exit(1)\nimport time\ntime.sleep(30)\n")
    specs = isolated / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True)
    (specs / "oom.yaml").write_text("name: oom\ntrainer: oom_probe\nwatchdog: {enabled: false}\n")
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    assert cli("submit", "local", "oom").code == 0
    assert wait_state(cli, 1)["state"] == "failed"
    result = cli("diagnose", "1")
    assert result.code == 0, result.err
    assert "first failure: cuda-out-of-memory" in result.out and "job 1: oom on local, failed" in result.out
    assert json.loads(cli("diagnose", "1", "--json").out)["first"]["host"]  # the job's head node


def test_bad_arguments_are_one_line_errors(cli):
    assert cli("diagnose").code == 2
    result = cli("diagnose", "--log", "/nonexistent.log")
    assert result.code == 2 and "no such file" in result.err and len(result.err.splitlines()) == 1


CASCADE = """import os, time
import torch
import torch.distributed as dist
from mmm_orch.runtime import dist as runtime_dist

rt = runtime_dist.setup()
dist.barrier()
if rt.rank == 1:
    time.sleep(1)
    raise RuntimeError("Numpy is not available")  # the first failure, on one rank
value = torch.ones(1)
dist.all_reduce(value)  # rank 0 waits here for rank 1, then sees its peer gone
"""


@pytest.mark.slow
def test_the_first_failure_is_the_exception_not_the_peers_that_lost_it(cli, isolated, monkeypatch):
    """A Python exception on one rank, then gloo "Connection closed by peer" on the others (the
    numpy case): the exception is the first failure, whatever order the lines arrive in."""
    (isolated / "cascade_probe.py").write_text(CASCADE)
    specs = isolated / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True)
    (specs / "cascade.yaml").write_text("name: cascade\ntrainer: cascade_probe\n")
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    assert cli("submit", "local", "cascade").code == 0
    assert wait_state(cli, 1)["state"] == "failed"
    log = cli("logs", "1").out
    assert "Connection closed by peer" in log or "Connection reset by peer" in log, log[-3000:]
    first = json.loads(cli("diagnose", "1", "--json").out)["first"]
    assert first["signature"] == "python-exception"
    assert "Numpy is not available" in first["line"]
