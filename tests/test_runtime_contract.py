"""Your own code under mmm-orch's runtime (mmm_orch.runtime, docs/runtime.md), through the example
project in examples/tinytrain: the contract in a process of its own (steps reported, a stop
signal saves and exits 75, a resume goes on from the latest checkpoint, a resume with nothing to
resume from is refused); and on the live Slurm cluster, the project launched inside an
allocation on two nodes, where Ctrl-C makes every rank save and stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from helpers.jobs import TERMINAL, wait_state

EXAMPLE = REPO / "examples" / "tinytrain"
TRAIN = ["python3", "-m", "tinytrain.train"]


@pytest.fixture
def project(isolated: Path) -> Path:
    """The example project, copied to stand where its user works (jobs run from there)."""
    shutil.copytree(EXAMPLE, isolated, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    return isolated


def steps_of(run_dir: str | Path) -> list[int]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "step"]


def train(project: Path, run_dir: Path, *argv: str, **env: str) -> subprocess.Popen:
    """The example's training as one process of its own, told what a job would tell it."""
    return subprocess.Popen(
        [sys.executable, "-m", "tinytrain.train", *argv], cwd=project, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "MMM_ORCH_RUN_DIR": str(run_dir), **env})


def test_importing_the_runtime_needs_no_torch():
    code = "import sys; from mmm_orch import runtime; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.slow
def test_the_contract_in_one_process_steps_stop_and_resume(project):
    run_dir = project / "outputs" / "run"
    done = train(project, run_dir, "--steps", "6", "--checkpoint-every", "3")
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert "[mmm-orch] first_step=" in out and "step=6 loss=" in out
    assert steps_of(run_dir) == [1, 2, 3, 4, 5, 6]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-6"

    resumed = train(project, run_dir, "--steps", "9", "--checkpoint-every", "3",
                    MMM_ORCH_RESUME="1")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert "[resume] step=6 " in out and "[mmm-orch] resumed_step=" in out and "step=1 " not in out
    assert steps_of(run_dir) == list(range(1, 10))

    # A stop signal mid-run: the step in flight is saved and the process says so with exit 75.
    running = train(project, run_dir, "--steps", "100000", "--checkpoint-every", "0",
                    "--step-time", "0.05", MMM_ORCH_RESUME="1")
    deadline = time.monotonic() + 120
    while (steps_of(run_dir)[-1] if (run_dir / "metrics.jsonl").exists() else 0) < 12:
        assert time.monotonic() < deadline and running.poll() is None, running.stderr.read()
        time.sleep(0.2)
    running.send_signal(signal.SIGUSR1)
    out, err = running.communicate(timeout=120)
    assert running.returncode == 75, err
    saved = int((run_dir / "checkpoints" / "latest").read_text().removeprefix("step-"))
    assert saved >= 12 and steps_of(run_dir) == list(range(1, saved + 1))
    assert f"[checkpoint] step={saved} " in out


@pytest.mark.slow
def test_a_resume_with_nothing_to_resume_from_is_refused_unless_a_fresh_start_is_allowed(project):
    run_dir = project / "outputs" / "empty"
    refused = train(project, run_dir, "--steps", "2", MMM_ORCH_RESUME="1")
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and "asked to resume" in err and "step=" not in out
    fresh = train(project, run_dir, "--steps", "2", MMM_ORCH_RESUME="1", MMM_ORCH_ALLOW_FRESH="1")
    out, err = fresh.communicate(timeout=120)
    assert fresh.returncode == 0 and steps_of(run_dir) == [1, 2], err


def test_a_command_resumes_only_when_its_workload_says_so(cli, project):
    refused = cli("submit", "slurm-local", "--chain", "3", "--dry-run", "--", *TRAIN)
    assert refused.code == 2 and "resumable: true" in refused.err and refused.out == ""
    script = cli("submit", "slurm-local", "tinytrain", "--chain", "2", "--dry-run", "--", *TRAIN)
    assert script.code == 0, script.err
    first, later = script.out.split("# Links 2-2 differ only in these lines")
    assert "export MMM_ORCH_RUN_DIR=" in first and "MMM_ORCH_RESUME" not in first
    assert "#   export MMM_ORCH_RESUME=1" in later and "MMM_ORCH_ALLOW_FRESH" not in later


# Over walltimes (a chain) and on a spare node (failover), a run is carried by the job script,
# the watchdog and the failover loop, the same for a trainer and for a command that keeps this
# contract: live on each scheduler in test_long_runs and test_failover. What is the command's own
# is proven here and in-process: its resume told by the environment (the contract test above;
# the chain's later links, test_a_command_resumes_only_when_its_workload_says_so; a failover's
# relaunch, test_failover's hang retried on the spare).


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_the_example_launched_inside_salloc_runs_on_both_nodes_and_saves_on_ctrl_c(cli, project):
    """`launch` with no MACHINE (found from the allocation's nodes), the example on 2 nodes x 2
    ranks; Ctrl-C to the launch reaches every rank on every node, the step in flight is saved (a
    checkpoint only a stop makes: --checkpoint-every 0) before they stop, and nothing of the run
    is left running."""
    import psutil

    from mmm_orch.records.db import open_db

    salloc = subprocess.Popen(
        ["salloc", "-p", "debug", "--ntasks-per-node=2", "-t", "00:10:00", "-N", "2",
         sys.executable, "-m", "mmm_orch", "launch", "tinytrain", "--", *TRAIN, "--steps",
         "100000", "--step-time", "0.1", "--checkpoint-every", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while (db := open_db(None)) is None or (record := db.get(1)) is None or not record.run_dir:
            assert time.monotonic() < deadline and salloc.poll() is None, "no launch recorded"
            time.sleep(0.5)
        run_dir = Path(record.run_dir)
        while not (run_dir / "metrics.jsonl").exists() or len(steps_of(run_dir)) < 3:
            assert time.monotonic() < deadline and salloc.poll() is None, "no steps"
            time.sleep(0.5)
        ranks = [env["SLURMD_NODENAME"] for _, env in _processes_told_to_write_into(run_dir)
                 if "SLURMD_NODENAME" in env]  # (slurmd's tasks: the ranks, not srun)
        assert len(ranks) == 4 and len(set(ranks)) == 2, ranks
        launch = next(p for p in psutil.Process(salloc.pid).children(recursive=True)
                      if "launch" in p.cmdline() and "mmm_orch" in p.cmdline())
        launch.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground process
        output, _ = salloc.communicate(timeout=180)
    finally:
        if salloc.poll() is None:
            salloc.kill()
    assert salloc.returncode == 130, output[-3000:]
    assert "stopping job 1" in output and "ranks=4 nodes=2" in output, output[-3000:]
    row = wait_state(cli, 1, TERMINAL, timeout=60)
    assert (row["state"], row["workload"], row["machine"]) == \
        ("cancelled", "tinytrain", "slurm-local"), row
    saved = int((run_dir / "checkpoints" / "latest").read_text().removeprefix("step-"))
    assert saved >= 3 and steps_of(run_dir) == list(range(1, saved + 1)), output[-4000:]
    assert _processes_told_to_write_into(run_dir) == []
    allocation = output.split("Granted job allocation ")[1].split()[0]
    steps = subprocess.run(["squeue", "-h", "-s", "-j", allocation], capture_output=True,
                           text=True, timeout=30)
    assert steps.stdout.strip() == "", steps.stdout


def _processes_told_to_write_into(run_dir: Path) -> list[tuple[int, dict[str, str]]]:
    """(pid, environment) of the processes whose environment names `run_dir` as their run's:
    its ranks on any node, and what started them."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if (env := process.environ()).get("MMM_ORCH_RUN_DIR") == str(run_dir):
                found.append((process.pid, env))
        except psutil.Error:  # ended meanwhile
            continue
    return found
