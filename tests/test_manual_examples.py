"""The manual's examples run as written. The first page a user reads cannot be wrong: every
command block of docs/getting-started.md is run as written, by the installed command, as a user would type it. The fresh machine's main job
runs on the local executor. The first time on a facility runs on the live PBS test server,
standing in for Aurora (a profile of the user's own named `aurora`, as a user may override one,
whose jobs run a Python of their own without mmm-orch, as a facility's module gives them), after
`pip install ./mmm-orch` into a fresh virtual environment; the review (`--dry-run`) needs no
scheduler and runs against the real Aurora profile. The page on adding a workload: its spec, a
trainer module of the user's that reports its steps, and its commands, on the local executor."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from helpers.manual import blocks
from helpers.training import training_turn

PAGE = REPO / "docs" / "getting-started.md"
# The lines not run here, and why: each is what brought this test where it is.
NOT_RUN = {
    "bash scripts/setup.sh": "made the environment this suite runs in (scripts/test.sh runs it "
                             "first); a second run here would reinstall it under the other tests",
    "bash scripts/test.sh": "the suite itself",
}


def test_the_page_has_the_blocks_this_test_runs():
    assert blocks(PAGE) == [
        ["bash scripts/setup.sh && .venv/bin/mmm-orch submit local fsdp --follow"],
        ["bash scripts/test.sh"],
        ["pip install ./mmm-orch",
         "mmm-orch env create aurora -A MYPROJ",
         "mmm-orch env check aurora -A MYPROJ",
         "mmm-orch submit aurora dist_check -N 2 -A MYPROJ --follow",
         "mmm-orch submit aurora llama3_8b -N 4 -A MYPROJ --dry-run"],
    ]


def run(line: str, cwd: Path, bin_dir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`line` in a shell, as typed, with `bin_dir`'s commands first on PATH."""
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_fresh_machine_s_main_job(isolated):
    setup, main = blocks(PAGE)[0][0].split(" && ")
    assert setup in NOT_RUN
    (isolated / ".venv").symlink_to(Path(sys.prefix))  # the environment setup.sh made
    with training_turn():  # the job trains on this host's cores
        done = run(main, isolated, Path(sys.prefix) / "bin")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # What the page says it prints: the loss per step, test loss and accuracy per epoch.
    assert re.search(r"^step=1 epoch=1 loss=", done.stdout, re.M), done.stdout[-2000:]
    assert re.search(r"^\[epoch\] epoch=2 train_loss=\S+ test_loss=\S+ test_acc=", done.stdout,
                     re.M), done.stdout[-2000:]
    assert "job 1 completed (exit 0)" in done.stderr
    assert blocks(PAGE)[1] == ["bash scripts/test.sh"] and blocks(PAGE)[1][0] in NOT_RUN


def test_the_first_time_on_a_facility(isolated, pbs_server, facility_python, tmp_path,
                                      leftovers_cancelled):
    lines = blocks(PAGE)[2]
    # The user's clone (a copy of the source: pip builds in it), and a fresh virtual environment.
    shutil.copytree(REPO, isolated / "mmm-orch", ignore=shutil.ignore_patterns(
        ".git", ".venv", ".*_cache", "build", "*.egg-info", "__pycache__", "vendor", "tests",
        "benchmarks", ".whl", ".bench"))
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True, timeout=300)
    standin = isolated / ".mmm-orch" / "machines"
    standin.mkdir(parents=True)
    (standin / "aurora.yaml").write_text(
        "extends: pbs-local\nname: aurora\npython: python3\n"
        f"setup: [{json.dumps('source ' + shlex.quote(str(facility_python / 'bin' / 'activate')))}]\n"
        f"environment: {{path: {json.dumps(str(tmp_path / 'envs' / 'aurora'))}}}\n")
    review = tmp_path / "review"  # where the real Aurora profile is the one found
    review.mkdir()

    installed = run(lines[0], isolated, fresh / "bin", timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (fresh / "bin" / "mmm-orch").exists()
    mine = run("command -v mmm-orch", isolated, fresh / "bin")
    assert mine.stdout.strip() == str(fresh / "bin" / "mmm-orch")

    created = run(lines[1], isolated, fresh / "bin")
    assert created.returncode == 0, created.stderr
    assert "installed mmm-orch 0.1.0" in created.stdout
    checked = run(lines[2], isolated, fresh / "bin")
    assert checked.returncode == 0, checked.stderr
    assert f"job environment of aurora: {tmp_path / 'envs' / 'aurora'}" in checked.stdout
    preflight = run(lines[3], isolated, fresh / "bin")
    assert preflight.returncode == 0, preflight.stdout[-3000:] + preflight.stderr
    assert "[dist_check] PASS world=4" in preflight.stdout
    status = run("mmm-orch status --json", isolated, fresh / "bin")
    (job,) = json.loads(status.stdout)
    assert (job["machine"], job["state"], job["exit_code"]) == ("aurora", "completed", 0)

    script = run(lines[4], review, fresh / "bin")
    assert script.returncode == 0, script.stderr
    assert "#PBS -A MYPROJ" in script.stdout and "#PBS -q debug-scaling" in script.stdout
    assert "Layout: 4 node(s) x 12 ranks = 48 ranks" in script.stdout
    assert "module load frameworks" in script.stdout
    after = run("mmm-orch status --json", isolated, fresh / "bin")
    assert len(json.loads(after.stdout)) == 1  # the review submitted nothing


WORKLOAD_PAGE = REPO / "docs" / "development" / "adding-a-workload.md"
# The user's trainer: takes the spec's options, reports each step as the watchdog reads them.
MYPKG_TRAIN = """\
import argparse, time
from mmm_orch import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--compile", action="store_true")
args = parser.parse_args()
for step in range(1, args.steps + 1):
    runtime.report_step(step, loss=1.0 / step, lr=args.lr)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_adding_a_workload(isolated):
    spec, commands, refused = blocks(WORKLOAD_PAGE, comments=True)[:3]
    assert spec[0] == "# ./.mmm-orch/workloads/mytrain.yaml"
    (isolated / ".mmm-orch" / "workloads").mkdir(parents=True)
    (isolated / ".mmm-orch" / "workloads" / "mytrain.yaml").write_text("\n".join(spec) + "\n")
    (isolated / "mypkg").mkdir()
    (isolated / "mypkg" / "__init__.py").write_text("")
    (isolated / "mypkg" / "train.py").write_text(MYPKG_TRAIN)
    bin_dir = Path(sys.prefix) / "bin"
    assert commands == ["mmm-orch show workload mytrain",
                        "mmm-orch submit local mytrain --set lr=1e-3 --dry-run",
                        "mmm-orch submit local mytrain --set lr=1e-3 --follow"]

    shown = run(commands[0], isolated, bin_dir)
    assert shown.returncode == 0 and "trainer: mypkg.train" in shown.stdout, shown.stderr
    review = run(commands[1], isolated, bin_dir)
    assert review.returncode == 0, review.stderr
    said = re.search(r"ends `(-m mypkg\.train [^`]*)`", WORKLOAD_PAGE.read_text())
    assert said and re.search(rf"launch: .*{re.escape(said.group(1))}'$", review.stdout, re.M)
    done = run(commands[2], isolated, bin_dir)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^step=20 .*lr=0\.001", done.stdout, re.M), done.stdout[-2000:]

    command, message = refused
    bad = run(command.removeprefix("$ "), isolated, bin_dir)
    assert (bad.returncode, bad.stderr.strip()) == (2, message)
    status = run("mmm-orch status --json", isolated, bin_dir)
    assert len(json.loads(status.stdout)) == 1  # the one run, nothing of the refusal
