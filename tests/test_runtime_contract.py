"""Your own code under mmm-orch's runtime (mmm_orch.runtime, docs/runtime.md), through the example
project in examples/tinytrain: the contract in a process of its own (steps reported, a stop
signal saves and exits 75, a resume goes on from the latest checkpoint, a resume with nothing to
resume from is refused); and on the live schedulers, the project carried across walltimes by
`--chain 4`, surviving the SIGKILL of one node's ranks with `--spare-nodes 1`, and launched
inside an allocation."""

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

from conftest import REPO, TERMINAL, wait_state
from faults import signal_node

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


@pytest.mark.live
@pytest.mark.starts_first
@pytest.mark.timeout(1800)  # up to four links of two minutes, on a loaded host
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_the_example_carries_across_walltimes_in_a_chain(request, cli, project, kind,
                                                                  leftovers_cancelled):
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    machine = "slurm-local" if kind == "slurm" else "pbs-local"
    # 0.5 s a step, and the stop 40 s before a 2-minute walltime (a third of it): one link runs
    # at most 160 steps, so 180 need two links at least, and four leave a loaded host's starts
    # (up to a minute each) room.
    result = cli("submit", machine, "tinytrain", "--walltime", "00:02:00", "--chain", "4",
                 "--json", "--", *TRAIN, "--steps", "180", "--step-time", "0.5",
                 "--checkpoint-every", "0")
    assert result.code == 0, result.err
    links = json.loads(result.out)
    rows = [wait_state(cli, link["id"], timeout=900) for link in links]
    ran = [row for row in rows if row["state"] != "cancelled"]
    logs = "\n".join(cli("logs", str(row["id"])).out[-3000:] for row in ran)
    assert len(ran) >= 2 and ran[-1]["state"] == "completed", (rows, logs)
    assert all(row["state"] == "timeout" and row["reason"].startswith("resumable at step")
               for row in ran[:-1]), rows
    assert steps_of(links[0]["run_dir"]) == list(range(1, 181))  # every step once, in order
    assert "the training finished in link" in cli("status").out


@pytest.mark.live
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_the_example_survives_the_loss_of_a_nodes_ranks_on_a_spare(request, cli, project, kind,
                                                                   leftovers_cancelled):
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    machine = "slurm-local" if kind == "slurm" else "pbs-local"
    result = cli("submit", machine, "tinytrain", "--nodes", "2", "--spare-nodes", "1", "--json",
                 "--", *TRAIN, "--steps", "200", "--step-time", "0.1", "--checkpoint-every", "10")
    assert result.code == 0, result.err
    row = json.loads(result.out)
    wait_state(cli, row["id"], ("running", *TERMINAL))  # three whole nodes: it may queue first
    deadline = time.monotonic() + 300
    while not ((Path(row["run_dir"]) / "metrics.jsonl").exists()
               and steps_of(row["run_dir"])[-1] >= 25):
        assert time.monotonic() < deadline, cli("logs", str(row["id"])).out[-3000:]
        time.sleep(1)
    active = json.loads((Path(row["job_dir"]) / "failover.json").read_text())["active"]
    signal_node(row["native_id"], active[1], signal.SIGKILL, module="tinytrain.")

    done = wait_state(cli, row["id"], timeout=400)
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "completed", log[-4000:]
    assert f"[mmm-orch] failover: retired {active[1]} at=" in log and "attempt 2/2: success" in log
    resumed_at = int(log.split("[resume] step=")[1].split()[0])
    assert resumed_at >= 20 and resumed_at % 10 == 0, resumed_at
    assert steps_of(row["run_dir"]) == list(range(1, 201))  # the replayed steps recorded once


@pytest.mark.usefixtures("slurm_cluster", "leftovers_cancelled")
def test_the_example_launched_inside_salloc_runs_on_both_nodes(cli, project):
    proc = subprocess.run(["salloc", "-p", "debug", "--ntasks-per-node=2", "-t", "00:10:00", "-N",
                           "2", sys.executable, "-m", "mmm_orch", "launch", "tinytrain", "--", *TRAIN,
                           "--steps", "20"],  # no MACHINE: found from the allocation's nodes
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step=20 loss=" in proc.stdout and "ranks=4 nodes=2" in proc.stdout
    row = wait_state(cli, 1, TERMINAL, timeout=60)
    assert (row["state"], row["exit_code"], row["workload"]) == ("completed", 0, "tinytrain")
    assert row["machine"] == "slurm-local" and steps_of(row["run_dir"]) == list(range(1, 21))
