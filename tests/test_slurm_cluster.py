"""Acceptance on the project's real two-node Slurm cluster (scripts/slurm-cluster.sh):
slurmctld, two slurmd, slurmdbd with MariaDB, munge. Run as root (CI does). Its jobs print or
sleep; a trainer across two nodes runs in test_failover and test_long_runs (their live Slurm
runs of the paced Llama trainer), and the fsdp trainer's falling loss in test_trainers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.faults import HANG
from helpers.jobs import (
    TERMINAL,
    assert_nothing_recorded,
    submit_over_walltime,
    wait_in_db,
    wait_state,
)
from helpers.profiles import write_probe
from helpers.schedulers import command_wrappers
from mmm_orch.records.db import JobDB

pytestmark = pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")


def db_file() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"


@pytest.fixture(scope="module")
def over_walltime(slurm_cluster, tmp_path_factory):
    """A one-node job that outlives its 1-minute walltime, submitted after the two-node test so
    that its wait overlaps the other (one-node) tests; checked by the last test of this module."""
    return submit_over_walltime("slurm-local", tmp_path_factory.mktemp("walltime"))


# The two tests that use the walltime job above, on one worker: one such job for the whole run
# instead of one for each worker that runs either test.
OVER_WALLTIME_WORKER = pytest.mark.xdist_group("slurm-walltime")


def test_dist_check_on_two_nodes_through_srun_then_one_refresh_for_500_jobs(cli, tmp_path):
    submitted = cli("submit", "slurm-local", "dist_check", "--nodes", "2")
    assert submitted.code == 0, submitted.err
    assert "slurm id" in submitted.out
    row = wait_state(cli, 1, TERMINAL)
    assert (row["state"], row["exit_code"]) == ("completed", 0), cli("logs", "1").out
    log = cli("logs", "1").out
    nodes = sorted({line.split(" node=")[1].split()[0] for line in log.splitlines()
                    if line.startswith("[dist_check] rank=") and " node=" in line})
    assert len(nodes) == 2 and set(nodes) <= {"n1", "n2", "n3"}, nodes
    for rank in range(4):
        node = nodes[rank // 2]  # srun places ranks block-wise: two per node, in node order
        assert f"[dist_check] rank={rank} local_rank={rank % 2} node={node} device=cpu " \
               "backend=gloo launcher=slurm" in log
        assert f"[dist_check] rank={rank} all_reduce OK (got 10, expected 10)" in log
    assert f"[dist_check] PASS world=4 nodes={','.join(nodes)} backend=gloo" in log
    assert "srun --nodes=2 --ntasks=4 --ntasks-per-node=2" in log
    one_squeue_and_one_sacct_for_500_jobs(tmp_path)


def one_squeue_and_one_sacct_for_500_jobs(tmp_path: Path) -> None:
    """Beside job 1 (ended), 499 jobs made from its record that the controller has never heard
    of (squeue skips them, sacct has no row for them): refreshing all 500 is one squeue and one
    sacct; with only ended jobs, no scheduler call at all."""
    db = JobDB(db_file())
    template = {k: v for k, v in db.get(1).to_dict(full=True).items()
                if k not in ("id", "events", "state", "native_state", "reason", "exit_code",
                             "signal", "started_at", "ended_at", "checked_at")}
    for i in range(499):
        db.insert(**{**template, "native_id": str(900000 + i), "state": "pending"})
    calls = tmp_path / "calls.log"
    path = command_wrappers(tmp_path / "bin", ["squeue", "sacct", "scontrol", "sbatch"], calls)
    proc = run_cli("status", "--all", env={"PATH": path})
    assert proc.returncode == 0, proc.stderr
    made = [line.split()[0] for line in calls.read_text().splitlines()]
    assert sorted(made) == ["sacct", "squeue"]  # its speed is measured in benchmarks/
    lines = proc.stdout.splitlines()
    assert len(lines) == 501  # header + 500 jobs
    assert lines[1].split()[4] == "completed"
    # Terminal jobs are cached: with only terminal jobs, no scheduler call at all.
    calls.unlink()
    proc = run_cli("status", "1", env={"PATH": path})
    assert proc.returncode == 0 and not calls.exists()


@OVER_WALLTIME_WORKER
def test_a_ranks_exit_code_above_128_ends_the_job_failed_with_it(cli, isolated, monkeypatch,
                                                                 over_walltime):
    """Rank 1 still runs when rank 0 exits 200, so srun terminates it and returns 143: the job's
    exit code is still rank 0's. And 200 stays 200: sacct before Slurm 25.11 reads it as 72 (it
    subtracts 128); the controller has it right."""
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "exit200", "import os, sys, time\n"
                "sys.exit(200) if os.environ['SLURM_PROCID'] == '0' else time.sleep(120)\n")
    assert cli("submit", "slurm-local", "exit200").code == 0
    row = wait_state(cli, 1, TERMINAL)
    log = cli("logs", "1").out
    assert (row["state"], row["exit_code"]) == ("failed", 200), log[-2000:]
    assert "Terminating StepId" in log
    assert "[mmm-orch] watchdog: a rank exited with code 200 first; the launch returned 143" in log
    assert row["native_state"] == "FAILED"
    assert row["end_class"] == "no-first-step"  # (it exited before any step)
    # Start and end are the controller's, not the moments status happened to look (the last row
    # of that id: a cluster set up again gives its ids again, and sacct lists the older first).
    times = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "Start,End", "-j", row["native_id"]],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "SLURM_TIME_FORMAT": "%s"}).stdout.split()[-1].split("|")
    assert (row["started_at"], row["ended_at"]) == (float(times[0]), float(times[1]))


def test_cancelled_running_job_ends_cancelled(cli, isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "sleeper", "import time\ntime.sleep(900)\n")
    assert cli("submit", "slurm-local", "sleeper").code == 0
    wait_state(cli, 1, ("running",), timeout=120)
    result = cli("cancel", "1")
    assert result.code == 0, result.err
    row = wait_state(cli, 1, TERMINAL, timeout=60)
    assert row["state"] == "cancelled" and row["exit_code"] is None
    assert row["end_class"] == "cancelled"
    history = json.loads(cli("show", "1", "--json").out)["events"]
    assert [e["state"] for e in history][:2] == ["submitting", "pending"]
    assert history[-1]["state"] == "cancelled"


def test_unknown_partition_is_the_schedulers_error_and_leaves_nothing(cli, isolated):
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "slurm-nopart.yaml").write_text(
        "extends: slurm-local\nname: slurm-nopart\n"
        "queues: [{name: nosuchpartition, max_nodes: 2, max_walltime: '01:00:00'}]\n")
    result = cli("submit", "slurm-nopart", "dist_check")
    assert result.code == 2
    assert result.err.strip() == ("mmm-orch: error: sbatch: sbatch: error: invalid partition "
                                  "specified: nosuchpartition | sbatch: error: Batch job "
                                  "submission failed: Invalid partition name specified")
    assert_nothing_recorded()


# Alone: its 200 parked jobs are more than Frontier's 100 per user, and a review of a Frontier
# script elsewhere in the suite counts the jobs of the Slurm on this computer (as on a login node).
@pytest.mark.serial
def test_eight_processes_submitting_25_jobs_each(isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "noop", "pass\n")
    # The parked partition accepts jobs and never runs them: this test is about submission.
    code = ("import sys\nfrom mmm_orch.cli import main\n"
            "for _ in range(25):\n"
            "    rc = main(['submit', 'slurm-local', 'noop', '--name', 'burst', '-q', 'parked'])\n"
            "    assert rc == 0, rc\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=isolated, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
        db = JobDB(db_file())
        records = db.list()
        assert len(records) == 200
        assert len({r.native_id for r in records}) == 200
        assert sorted(r.id for r in records) == list(range(1, 201))
        assert all(Path(r.script_path).read_text() == db.get(r.id).script for r in records)
    finally:
        subprocess.run(["scancel", "--name=burst"], check=False)


@pytest.mark.serial  # stops the shared controller: no other test may run meanwhile
def test_controller_down_gives_stale_states_then_recovers(cli, isolated, monkeypatch, slurm_cluster):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "sleeper", "import time\ntime.sleep(900)\n")
    assert cli("submit", "slurm-local", "sleeper").code == 0
    wait_state(cli, 1, ("running",), timeout=120)
    subprocess.run(["bash", str(slurm_cluster), "stop-controller"], check=True, capture_output=True)
    try:
        start = time.monotonic()
        down = cli("status")
        assert time.monotonic() - start < 30
        assert down.code == 0
        assert "scheduler not reachable, showing last known states" in down.err
        row = down.out.splitlines()[1].split()
        assert row[4] == "running" and row[-2] == "stale"
        stale = json.loads(cli("status", "--json").out)[0]
        assert stale["stale"] and stale["stale_age_s"] >= 0
    finally:
        subprocess.run(["bash", str(slurm_cluster), "start-controller"], check=True,
                       capture_output=True)
    up = json.loads(cli("status", "--json").out)[0]
    assert up["state"] == "running" and not up["stale"]
    assert cli("cancel", "1").code == 0
    assert wait_state(cli, 1, TERMINAL, timeout=60)["state"] == "cancelled"


@OVER_WALLTIME_WORKER
def test_job_over_its_walltime_ends_timeout(over_walltime):
    row = wait_in_db(over_walltime, 1, timeout=240)
    assert row["state"] == "timeout", row
    assert row["native_state"] == "TIMEOUT" and row["end_class"] == "walltime"


def test_watchdog_ends_a_job_hung_in_a_collective(cli, isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "hang", HANG, extra="watchdog: {first_step_timeout: '00:02:00', "
                                              "step_timeout: '00:00:08'}\n")
    submitted = cli("submit", "slurm-local", "hang", "--nodes", "2")
    assert submitted.code == 0, submitted.err
    row = wait_state(cli, 1, TERMINAL, timeout=300)
    assert (row["state"], row["exit_code"]) == ("hung", 124), cli("logs", "1").out
    assert row["reason"] == "no step completed in 8s after step 3; last_step=3"
    assert row["end_class"] == "hang"
    assert row["ended_at"] - row["started_at"] < 90  # not the 60-minute walltime
    log = cli("logs", "1").out
    assert "[mmm-orch] hung: no step completed in 8s after step 3" in log
    assert "[mmm-orch] launch_end=" in log and "exit_code=124" in log
    diagnosis = json.loads(cli("diagnose", "1", "--json").out)["first"]
    assert diagnosis["signature"] == "watchdog-hung" and diagnosis["host"]
    assert not subprocess.run(["squeue", "--noheader", "--jobs", JobDB(db_file()).get(1).native_id],
                              capture_output=True, text=True).stdout.strip()
