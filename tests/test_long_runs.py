"""Long runs across walltimes. On the live schedulers, once on each: a chain of 2-minute jobs
carries one training run to its end across at least one walltime, each link saving before it
and the next resuming from there, with the loss curve of a run that was never stopped; on
Slurm, a chain whose first link fails stops there. A slow save still beats the walltime kill (the watchdog's margin, on a
launch that saves as the trainers do). (A stopped run's rerun continues it: test_local_jobs.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.training import run_steps
from helpers.profiles import PACED_SPEC, PACED_STEP_S, write_spec

pytestmark = pytest.mark.slow  # trainings, real jobs or processes for seconds

CHAIN_SPEC = """extends: llama3_debug
name: llama_chain
args: {config: debug, tiny: true, warmup_steps: 20}
watchdog: {walltime_margin: "00:00:20"}
"""


def local_run(isolated: Path, steps: int, run_name: str, nice: int = 0,
              sets: tuple[str, ...] = ()) -> subprocess.Popen:
    """The same training uninterrupted, on this computer (2 ranks, as one 2-rank test node)."""
    return subprocess.Popen(
        ["nice", "-n", str(nice), sys.executable, "-m", "mmm_orch", "submit", "local",
         "llama_chain", "--set", f"steps={steps}", "--set", f"run_name={run_name}",
         *(item for s in sets for item in ("--set", s)), "--walltime", "00:30:00", "--follow"],
        cwd=isolated, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=_reference_env(isolated))


def _reference_env(isolated: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(isolated / "reference-state")}


def _stop_local_runs(isolated: Path, follower: subprocess.Popen) -> None:
    """A test that failed while its local run trains: the run is cancelled, not left to take the
    CPUs from the tests after it."""
    if follower.poll() is not None:
        return
    env = _reference_env(isolated)
    try:
        listed = subprocess.run([sys.executable, "-m", "mmm_orch", "status", "--all", "--json"],
                                cwd=isolated, env=env, capture_output=True, text=True, timeout=120)
        open_jobs = [str(r["id"]) for r in json.loads(listed.stdout or "[]")
                     if r["state"] in ("submitting", "pending", "running")]
        subprocess.run([sys.executable, "-m", "mmm_orch", "cancel", *open_jobs], cwd=isolated,
                       env=env, capture_output=True, timeout=120)
    finally:
        follower.kill()


@pytest.mark.live
@pytest.mark.starts_first
@pytest.mark.timeout(1800)  # as its own deadline
@pytest.mark.parametrize("kind,layout", [("slurm", []), ("pbs", ["pp=2"])], ids=["slurm", "pbs"])
def test_a_chain_of_short_links_reaches_the_end_of_training(request, cli, isolated, kind, layout,
                                                            leftovers_cancelled):
    """On PBS the chain's run is a pipeline of two stages (its reference a dp run of the same
    global batch): the links' stops and resumes are a pipeline's too."""
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    machine = "slurm-local" if kind == "slurm" else "pbs-local"
    write_spec(isolated, "llama_chain", PACED_SPEC)
    # At most 95 s of training fit in one link (2 minutes, less the 20 s margin and a start of
    # 5 s or more), so 130 s of steps cross at least one walltime; twelve links leave a loaded
    # host's starts (a minute and more each) room. A link that reaches no step stops the chain.
    steps = round(130 / PACED_STEP_S)

    same = ("dtype=fp32", "global_batch=16")  # as the reference: the same samples each step
    sets = [item for s in (*same, *layout) for item in ("--set", s)]
    result = cli("submit", machine, "llama_chain", "--set", f"steps={steps}", *sets, "--walltime",
                 "00:02:00", "--chain", "12", "--json")
    assert result.code == 0, result.err
    links = json.loads(result.out)
    # Beside the links, at the lowest priority: it takes only the CPU time they leave (their
    # ranks must start and save in time), and the test no longer waits for it after the chain.
    reference = local_run(isolated, steps, "reference", nice=19, sets=same)
    request.addfinalizer(lambda: _stop_local_runs(isolated, reference))
    deadline = time.monotonic() + 1800
    while True:
        chain = cli("status").out  # before the rows: a link that ends between the two reads
        rows = json.loads(cli("status", "--all", "--json").out)  # shows ended in both
        if "completed" in chain.splitlines()[1] or "failed" in chain.splitlines()[1]:
            break
        assert time.monotonic() < deadline, chain
        time.sleep(5)
    ran = [r for r in rows if r["state"] != "cancelled"]
    assert "the training finished in link" in chain, (chain, _logs(cli, ran))
    assert len(ran) >= 2, rows
    assert all(r["state"] == "timeout" for r in ran[:-1]) and ran[-1]["state"] == "completed"
    assert all(r["reason"].startswith("resumable at step") for r in ran[:-1]), rows
    assert all(r["state"] == "cancelled" for r in rows[len(ran):])  # never ran

    got = run_steps(links[0]["run_dir"])
    assert [r["step"] for r in got] == list(range(1, steps + 1))  # every step once, in order
    assert reference.wait(timeout=900) == 0, reference.stderr.read()
    expected = {r["step"]: r for r in run_steps(isolated / "outputs" / "reference")}
    for record in got:
        want = expected[record["step"]]
        assert abs(record["loss"] - want["loss"]) < 1e-4, (record, want)
        assert abs(record["lr"] - want["lr"]) < 1e-9, (record, want)
    log = cli("logs", str(ran[0]["id"])).out
    assert "[mmm-orch] checkpointed before the walltime: step=" in log
    timeline = cli("timeline", str(ran[0]["id"])).out
    assert "walltime stop" in timeline


def _logs(cli, rows: list[dict]) -> str:
    """The ends of the jobs' logs, for a failure's message."""
    return "\n".join(f"== job {r['id']} ({r['state']})\n" + cli("logs", str(r["id"])).out[-1500:]
                     for r in rows)


@pytest.mark.starts_first
def test_a_chain_whose_first_link_fails_stops_there(cli, isolated, slurm_cluster,
                                                    leftovers_cancelled):
    write_spec(isolated, "llama_chain", CHAIN_SPEC)
    # (2-minute links: a loaded host's start of the trainer, a minute and more, still ends in the
    # trainer's own refusal, not the walltime; the chain stops at the first)
    result = cli("submit", "slurm-local", "llama_chain", "--set", "data_path=/nonexistent/tokens",
                 "--walltime", "00:02:00", "--chain", "3")
    assert result.code == 0, result.err
    deadline = time.monotonic() + 300
    while not ("failed" in (line := cli("status").out.splitlines()[1])):
        assert time.monotonic() < deadline, line
        time.sleep(3)
    assert "link 1 made no progress" in line
    rows = json.loads(cli("status", "--all", "--json").out)
    assert rows[0]["state"] == "failed"
    assert [r["state"] for r in rows[1:]] == ["cancelled", "cancelled"]
    assert all(r["started_at"] is None for r in rows[1:]), [  # no further link ran
        (r["native_id"], r["state"], r["started_at"], r["ended_at"], r["reason"]) for r in rows]
    # The trainer refuses the data before any step: one line, exit 2 (not a traceback).
    assert "[llama3] error: /nonexistent/tokens: no such dataset directory or token file" in \
        cli("logs", "1").out and "exit 2" in line


def test_a_slow_save_still_beats_the_walltime_kill():
    """A model whose save takes seconds, with a margin below the save time: the watchdog raises
    the margin to twice the longest save it saw (the periodic checkpoints show it), so that the
    stop still ends in a checkpoint before the scheduler's kill (its SIGTERM comes seconds before
    its SIGKILL: too late for a save). The watchdog as the job runs it, 30 s before the walltime
    with a margin of 1 s, around a launch that saves as the trainers do: a periodic save that took
    14 s, then the save of the stop, and exit 75. The stop is due at once after that save line,
    however late a loaded host shows it."""
    launch = ("trap 'echo \"[checkpoint] step=7 path=run/checkpoints/step-7 save_s=0.5 "
              "blocking_s=0.5 reason=signal\"; exit 75' USR1; echo step=6 loss=1; "
              "echo '[checkpoint] step=6 path=run/checkpoints/step-6 save_s=14.0 blocking_s=14.0 "
              "reason=periodic'; echo step=7 loss=1; sleep 600 & wait")
    proc = subprocess.run([sys.executable, "-m", "mmm_orch.injob.watchdog", "--first-step-timeout",
                           "60", "--step-timeout", "60", "--walltime-end", str(time.time() + 30),
                           "--margin", "1", "--", launch],
                          capture_output=True, text=True, timeout=120)
    stop = next(line for line in proc.stdout.splitlines() if "asking the trainers to save" in line)
    assert "(margin 28s: 2 x the longest save, 14.0s; step 7)" in stop, stop
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert "[mmm-orch] checkpointed before the walltime: step=7;" in proc.stdout, proc.stdout
