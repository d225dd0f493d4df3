"""The failover's verdicts on launchers that cannot run here (PALS on Aurora and Polaris): a real
process prints what the launcher prints (lines from the machines' own logs and ezpz's issues)
and exits as it does; the watchdog runs it; `classify` judges it with the machine's signatures.
test_failover.py has the live node loss on Slurm and PBS, and the other verdicts with srun's words."""

from __future__ import annotations

import shlex
import time

import pytest

from mmm_orch.config.failures import machine_failures
from mmm_orch.injob import watchdog
from mmm_orch.injob.failover import classify

ACTIVE = ["x4102c5s3b0n0", "x4305c1s6b0n0", "x4411c0s2b0n0"]


def attempt(lines: list[str], code: int, machine: str = "aurora", walltime_end: float | None = None,
            step_timeout: float = 60):
    script = "".join(f"echo {shlex.quote(line)}; " for line in lines) + f"exit {code}"
    launch = watchdog.run(script, first_step_timeout=60, step_timeout=step_timeout, grace=2)
    signatures = machine_failures(machine)
    return classify(launch, signatures, ACTIVE, walltime_end, margin=30)


def test_the_pals_child_that_stopped_answering_is_retired_not_the_parent():
    verdict = attempt(["step=12 loss=2.1",
                       "x4102c5s3b0n0: Couldn't forward RPC launch(abc) to child x4305c1s6b0n0.hostmgmt"
                       ".cm.aurora.alcf.anl.gov: Connection timed out"], 1)
    assert (verdict.kind, verdict.nodes, verdict.retry) == ("node", ("x4305c1s6b0n0",), True)


def test_a_failed_ping_blames_the_node_pinged():
    verdict = attempt(["step=3 loss=2.1", "x4102c5s3b0n0: ping failed on x4411c0s2b0n0: RPC timeout"], 1)
    assert verdict.nodes == ("x4411c0s2b0n0",)


@pytest.mark.parametrize("machine", ["aurora", "polaris"])
def test_a_shepherd_killed_by_sigkill_names_its_node(machine):
    verdict = attempt(["step=40 loss=1.0", "x4411c0s2b0n0.hsn.cm.aurora.alcf.anl.gov: shepherd died "
                       "from signal 9", "x4102c5s3b0n0: rank 0 died from signal 15"], 143, machine)
    assert (verdict.kind, verdict.nodes) == ("node", ("x4411c0s2b0n0",))


def test_exit_143_without_a_stop_signal_is_not_read_as_the_walltime():
    """ezpz once read rc=143 as a walltime kill and stopped with spares unused: the exit code
    alone says nothing; the scheduler's signal to the loop, or the clock, does."""
    verdict = attempt(["step=40 loss=1.0", "x4305c1s6b0n0: shepherd died from signal 9"], 143,
                      walltime_end=time.time() + 3600)
    assert verdict.kind == "node" and verdict.retry


def test_a_node_lost_with_the_walltime_spent_is_not_retried():
    verdict = attempt(["step=40 loss=1.0", "x4305c1s6b0n0: shepherd died from signal 9"], 143,
                      walltime_end=time.time() + 10)
    assert verdict.kind == "walltime" and not verdict.retry


def test_a_python_error_after_steps_is_the_code():
    verdict = attempt(["step=40 loss=1.0", "Traceback (most recent call last):",
                       "RuntimeError: shapes do not match"], 1)
    assert (verdict.kind, verdict.retry) == ("code", False)


def test_ranks_killed_without_a_node_named_rotate_one_out_blind():
    verdict = attempt(["step=40 loss=1.0", "Killed"], 137)
    assert (verdict.kind, verdict.nodes, verdict.retry) == ("node", (), True)


@pytest.mark.slow
def test_a_hang_ignores_the_kills_its_own_stop_caused():
    """The watchdog's stop of a hang makes the launcher report killed ranks on a node: that is
    the consequence of the stop, not evidence against the node."""
    launch_line = ("echo 'step=1 loss=1.0'; trap 'echo \"srun: error: n2: tasks 2-3: Killed\"; "
                   "exit 143' TERM; sleep 30 & wait")
    launch = watchdog.run(launch_line, first_step_timeout=60, step_timeout=2, grace=5)
    signatures = machine_failures("slurm-local")
    verdict = classify(launch, signatures, ["n1", "n2"], None, margin=30)
    assert launch.hung
    assert (verdict.kind, verdict.nodes, verdict.retry) == ("hang", (), True)
