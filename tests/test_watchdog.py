"""The launch watchdog, run as the job scripts run it, on real child processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

WATCHDOG = [sys.executable, "-m", "mmm_orch.injob.watchdog"]


def run(command: str, first: float = 5, step: float = 5, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*WATCHDOG, "--first-step-timeout", str(first), "--step-timeout", str(step),
                           "--grace", "2", "--", command], capture_output=True, text=True,
                          timeout=60, **kwargs)


def test_output_and_exit_code_pass_through():
    proc = run("echo 'step=1 loss=2'; echo to-stderr >&2; printf 'no newline'; exit 7")
    assert proc.returncode == 7
    assert proc.stdout == "step=1 loss=2\nto-stderr\nno newline"


@pytest.mark.slow
def test_no_first_step_in_time_is_a_hang():
    start = time.monotonic()
    proc = run("echo importing; sleep 300", first=1)
    assert proc.returncode == 124 and time.monotonic() - start < 10
    assert "[mmm-orch] hung: no first step within 1s of launch; last_step=none" in proc.stdout


@pytest.mark.slow
def test_steps_keep_it_alive_until_they_stop():
    proc = run("for i in 1 2 3 4 5 6; do echo \"step=$i\"; sleep 0.5; done; "
               "trap 'echo checkpoint on TERM; exit 143' TERM; sleep 300 & wait", first=2, step=1.5)
    assert proc.returncode == 124
    assert "no step completed in 2s after step 6; last_step=6" in proc.stdout
    assert "checkpoint on TERM" in proc.stdout  # the launch got SIGTERM first


def test_scheduler_signals_reach_the_launch(tmp_path):
    marker = tmp_path / "got"
    proc = subprocess.Popen([*WATCHDOG, "--first-step-timeout", "60", "--step-timeout", "60", "--",
                             f"trap 'echo USR1 > {marker}; exit 0' USR1; echo ready; sleep 300 & wait"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 0
    assert marker.read_text() == "USR1\n"


@pytest.mark.slow
def test_leftovers_of_an_ended_launch_do_not_hold_it():
    # The launch exits, but a child it left behind keeps the output pipe open.
    start = time.monotonic()
    proc = run("sleep 300 & echo launched; exit 5")
    assert proc.returncode == 5
    assert time.monotonic() - start < 20
    assert "launch exited (5) but processes it started still hold its output" in proc.stdout


# srun's own lines when rank 0 exited 3 and srun terminated rank 1 (recorded on the Slurm test
# cluster): srun then returns 143, the highest signal winning over any exit code.
SRUN_TEARDOWN = ("echo 'srun: error: n1: task 0: Exited with exit code 3' >&2; "
                 "echo 'srun: launch/slurm: _step_signal: Terminating StepId=4619.0' >&2; "
                 "echo 'srun: error: n1: task 1: Terminated' >&2; ")


def test_the_first_failed_rank_s_code_outlives_srun_s_teardown():
    proc = run(SRUN_TEARDOWN + "exit 143")
    assert proc.returncode == 3, proc.stdout
    assert proc.stdout.endswith("[mmm-orch] watchdog: a rank exited with code 3 first; the launch "
                                "returned 143 after ending the others: exit 3\n")


def test_a_rank_killed_first_keeps_the_launch_s_code():
    proc = run("echo 'srun: error: n2: task 1: Killed' >&2; " + SRUN_TEARDOWN + "exit 137")
    assert proc.returncode == 137 and "watchdog: a rank exited" not in proc.stdout


def test_a_rank_s_code_does_not_hide_a_signal_the_scheduler_sent(tmp_path):
    (tmp_path / "teardown.sh").write_text(SRUN_TEARDOWN + "exit 143\n")
    proc = subprocess.Popen([*WATCHDOG, "--first-step-timeout", "60", "--step-timeout", "60", "--",
                             f"trap 'bash {tmp_path}/teardown.sh; exit 143' TERM; echo ready; "
                             "sleep 300 & wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143


@pytest.mark.parametrize("stop_after_the_save", [False, True])
def test_a_save_on_the_scheduler_s_own_early_signal_is_said(stop_after_the_save):
    """Slurm's --signal reaches the ranks, not the watchdog, and may come before the watchdog's
    own stop: the trainers save, say so, and exit 75. The watchdog says the run checkpointed,
    also when its own stop came after that save (the stop then finds the save already made)."""
    left = 2 if stop_after_the_save else 3600  # seconds to the walltime; the margin is 1
    launch = ("trap '' USR1; echo 'step=3 loss=1'; "
              "echo '[checkpoint] step=3 path=run/checkpoints/step-3 save_s=0.1 blocking_s=0.1 "
              "reason=signal'; sleep 3; exit 75")
    proc = subprocess.run([*WATCHDOG, "--first-step-timeout", "30", "--step-timeout", "30",
                           "--walltime-end", str(time.time() + left), "--margin", "1", "--", launch],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert ("asking the trainers to save" in proc.stdout) == stop_after_the_save, proc.stdout
    assert "[mmm-orch] checkpointed before the walltime: step=3;" in proc.stdout, proc.stdout


@pytest.mark.slow  # the launcher and two ranks: three interpreters
def test_a_rank_s_refusal_under_the_local_launcher_ends_in_its_code_and_one_line(tmp_path):
    """The local profile's launcher (mmm_orch.injob.ranks): a rank's one-line refusal stays the
    launch's last word, with its exit code, and the other rank is ended; not torchrun's
    traceback and failure table."""
    rank = tmp_path / "rank.py"
    rank.write_text("import os, sys, time\n"
                    "if os.environ['RANK'] == '1':\n"
                    "    sys.exit(print('[trainer] error: --data: no such file', file=sys.stderr) or 2)\n"
                    "time.sleep(30)\n")
    proc = run(f"{sys.executable} -m mmm_orch.injob.ranks --standalone --nproc-per-node=2 "
               f"--no-python {sys.executable} {rank}", first=60)
    assert proc.returncode == 2, proc.stdout
    assert "[trainer] error: --data: no such file\n" in proc.stdout
    assert "Traceback" not in proc.stdout and "Root Cause" not in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().endswith("ranks: rank 1 exited with code 2 first: exit 2")
