"""Failover inside a job, against real processes that really fail on the live schedulers: the
ranks of one node SIGKILLed (the node is retired, a spare takes its place, training resumes from
the last checkpoint with the same losses), a bad option, an exception after steps, the walltime
stop, a node lost as the walltime ends (none retried), a hang (retried, blind), a second node lost
with no spare left, a cancel; the failed node is remembered and the next job keeps off it. One
test per row of the classification table in docs/guides/node-failures.md. And the loop's own failure ends the job
loudly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TERMINAL, paced_spec, wait_state, write_probe, write_spec
from faults import signal_node, trainer_pids
from mmm_orch.injob.protocol import EXIT_INTERNAL_ERROR
from mmm_orch.runtime.metrics import parse_line

# Tiny Llama 3 on 4 CPU ranks, a checkpoint every 10 steps, each step lasting 0.25 s or more
# (a quiet host's take 0.1 s): a kill after step 45 of 150 comes in the middle on any host, and a
# run that waits for its walltime waits rather than computes beside the other tests' jobs.
STEPS = 150
CHECKPOINTS = f"checkpoint_every: 10, steps: {STEPS}"
SPEC = paced_spec("llama_fo", CHECKPOINTS, step_s=0.25)
RANKS = "paced_llama3"  # the module its ranks run, by which the tests find them
UNTIL_THE_WALLTIME = paced_spec("llama_fo", "checkpoint_every: 10, steps: 100000",
                                'walltime_margin: "00:00:15"', step_s=0.25)
# No periodic saves: the stop's margin stays the workload's 15 s (a loaded host's slow save would
# raise it to twice the save, and the stop could come before a fault at 27 s left).
UNTIL_THE_WALLTIME_UNSAVED = paced_spec("llama_fo", "steps: 100000",
                                        'walltime_margin: "00:00:15"', step_s=0.25)
MACHINE = {"slurm": "slurm-local", "pbs": "pbs-local"}


def failover_state(row: dict) -> dict | None:
    try:
        return json.loads((Path(row["job_dir"]) / "failover.json").read_text())
    except (OSError, ValueError):
        return None


def steps(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "step"]


def step_losses(lines: list[str]) -> dict[int, float]:
    """step -> loss from rank 0's step lines."""
    found = {}
    for line in lines:
        if line.startswith("step="):
            fields = parse_line(line)
            found[int(fields["step"])] = float(fields["loss"])
    return found


def until(what, timeout: float, message):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, message()
        time.sleep(1)
    return value


def submit(cli, machine: str, *args: str) -> dict:
    result = cli("submit", machine, "llama_fo", *args, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def running_past(cli, row: dict, step: int, timeout: float = 240) -> dict:
    """The failover state once the launch has passed `step` (a checkpoint is behind it). The
    job may queue first behind the other tests' jobs (a spare needs a whole node): only the time
    it runs counts against `timeout`."""
    wait_state(cli, row["id"], ("running", *TERMINAL))
    until(lambda: failover_state(row) and steps(row["run_dir"])
          and steps(row["run_dir"])[-1]["step"] >= step, timeout,
          lambda: cli("logs", str(row["id"])).out[-3000:])
    return failover_state(row)


@pytest.mark.live
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_a_spare_takes_the_place_of_a_node_whose_ranks_were_killed(request, cli, isolated, kind,
                                                                    leftovers_cancelled):
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    machine = MACHINE[kind]
    write_spec(isolated, "llama_fo", SPEC)
    row = submit(cli, machine, "--nodes", "2", "--spare-nodes", "1")
    state = running_past(cli, row, 45)
    first_active, spare = state["active"], state["spares"]
    assert len(first_active) == 2 and len(spare) == 1 and state["attempt"] == 1
    note = json.loads(cli("status", str(row["id"]), "--json").out)[0]["reason"]
    assert f"active {','.join(first_active)}, spare {spare[0]}" in note
    victim = first_active[1]
    signal_node(row["native_id"], victim, signal.SIGKILL, RANKS)

    done = wait_state(cli, row["id"], timeout=400)
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "completed", log[-4000:]
    assert f"[mmm-orch] failover: retired {victim} at=" in log
    assert f"attempt 1/2: node: {victim} lost its ranks" in log
    assert "attempt=2/2" in log and f"active={first_active[0]},{spare[0]}" in log
    assert "attempt 2/2: success" in log
    assert done["reason"].startswith(f"attempt 2/2; {victim} retired ({victim} lost its ranks"), done

    # Training resumed from the last checkpoint: the steps between it and the kill ran twice,
    # with the same losses, then on to the end; the run's metrics hold every step once.
    lines = log.splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("[mmm-orch] failover: retired"))
    before, after = step_losses(lines[:cut]), step_losses(lines[cut:])
    resumed_at = min(after)
    assert f"[resume] step={resumed_at - 1} " in log and resumed_at % 10 == 1, resumed_at
    assert "[mmm-orch] resumed_step=" in log and sorted(after) == list(range(resumed_at, STEPS + 1))
    replayed = [(before[step], after[step]) for step in after if step in before]
    # (None replayed when the kill came right after a checkpoint, as under a loaded host.)
    assert max(before) >= resumed_at - 1 and all(abs(a - b) < 1e-4 for a, b in replayed), replayed
    assert [r["step"] for r in steps(row["run_dir"])] == list(range(1, STEPS + 1))
    timeline = cli("timeline", str(row["id"])).out
    assert f"retired {victim}" in timeline and f"resumed at step {resumed_at}" in timeline

    # Remembered: listed, and the next job keeps off it.
    nodes = json.loads(cli("nodes", "--json").out)
    assert [(n["machine"], n["node"], n["job_id"]) for n in nodes] == [(machine, victim, row["id"])]
    assert "lost its ranks" in nodes[0]["evidence"]
    if kind == "slurm":
        assert f"#SBATCH --exclude={victim}" in cli("submit", machine, "llama_fo", "--nodes", "2",
                                                    "--dry-run").out
        after_row = submit(cli, machine, "--nodes", "2", "--set", "steps=3")
        wait_state(cli, after_row["id"])
        used = subprocess.run(["sacct", "-j", after_row["native_id"], "-X", "-n", "-P", "-o", "NodeList"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        expanded = subprocess.run(["scontrol", "show", "hostnames", used], capture_output=True,
                                  text=True, timeout=30).stdout.split()
        assert len(expanded) == 2 and victim not in expanded, used
    else:  # PBS cannot exclude a vnode: the job takes it as its spare, used last
        after_row = submit(cli, machine, "--nodes", "2", "--spare-nodes", "1", "--set", "steps=3")
        assert wait_state(cli, after_row["id"])["state"] == "completed"
        attempt = next(line for line in cli("logs", str(after_row["id"])).out.splitlines()
                       if line.startswith("[mmm-orch] attempt=1/2"))
        assert attempt.endswith(f"spares={victim}"), attempt
    assert cli("nodes", "forget", victim).code == 0
    assert json.loads(cli("nodes", "--json").out) == []


def test_a_bad_option_fails_at_start_and_is_not_retried(cli, isolated, slurm_cluster,
                                                        leftovers_cancelled):
    write_spec(isolated, "llama_fo", "extends: llama3_debug\nname: llama_fo\n"  # the trainer's own
               "args: {config: debug, tiny: true, bogus: 1}\noptions:\n  bogus: {type: int}\n")
    row = submit(cli, "slurm-local", "--spare-nodes", "1")
    done = wait_state(cli, row["id"], timeout=240)
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "failed" and "unrecognized arguments: --bogus" in log, log[-3000:]
    assert ("attempt 1/2: start: failed before its first step (trainer-usage-error: llama3.py: "
            "error: unrecognized arguments: --bogus 1)") in log
    assert "attempt=2/2" not in log and "retired" not in log
    assert "start: failed before its first step" in done["reason"], done
    assert json.loads(cli("nodes", "--json").out) == []


def test_the_walltime_ends_the_run_and_is_not_retried(cli, isolated, slurm_cluster,
                                                      leftovers_cancelled):
    write_spec(isolated, "llama_fo", UNTIL_THE_WALLTIME)
    row = submit(cli, "slurm-local", "--spare-nodes", "1", "--walltime", "00:02:00")
    done = wait_state(cli, row["id"], timeout=420)
    log = cli("logs", str(row["id"])).out
    assert "attempt 1/2: checkpointed: saved a checkpoint before the walltime" in log, log[-3000:]
    assert "attempt=2/2" not in log
    assert done["state"] == "timeout" and done["reason"].startswith("resumable at step"), done


def test_a_node_lost_as_the_walltime_ends_is_not_retried(cli, isolated, slurm_cluster,
                                                        leftovers_cancelled):
    """A node fault with under 30 s of walltime left: a relaunch could not reach a step. (2:15 of
    walltime: a loaded host's start and five steps come before the fault, and no longer, since
    a longer job asks for Slurm's own early signal, which may stop the ranks up to a minute
    before the end: it did, 36 s before, in a 3-minute job.)"""
    write_spec(isolated, "llama_fo", UNTIL_THE_WALLTIME_UNSAVED)
    row = submit(cli, "slurm-local", "--spare-nodes", "1", "--walltime", "00:02:15")
    active = running_past(cli, row, 5)["active"][0]
    log = cli("logs", str(row["id"])).out
    job_start = float(log.split("[mmm-orch] job_start=", 1)[1].split()[0])
    time.sleep(max(0.0, job_start + 108 - time.time()))  # 27 s left, before the 15 s margin stop
    signal_node(row["native_id"], active, signal.SIGKILL, RANKS)
    done = wait_state(cli, row["id"], timeout=240)
    log = cli("logs", str(row["id"])).out
    assert "attempt 1/2: walltime: the walltime is spent" in log, log[-3000:]
    assert "attempt=2/2" not in log and "retired" not in log
    assert done["state"] == "failed" and "walltime: the walltime is spent" in done["reason"], done


def test_an_exception_after_steps_is_the_code_and_is_not_retried(cli, isolated, monkeypatch,
                                                                 slurm_cluster, leftovers_cancelled):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "diverges", "import time\n"
                "for step in range(1, 6):\n"
                "    print(f'step={step} loss={1 / step:.3f}', flush=True)\n"
                "    time.sleep(0.2)\n"
                "raise RuntimeError('the loss is nan at step 5')\n")
    result = cli("submit", "slurm-local", "diverges", "--spare-nodes", "1", "--json")
    assert result.code == 0, result.err
    row = json.loads(result.out)
    done = wait_state(cli, row["id"], timeout=240)
    log = cli("logs", str(row["id"])).out
    assert "attempt 1/2: code: failed after step 5 (" in log and "the loss is nan" in log, log[-3000:]
    assert "attempt=2/2" not in log and "retired" not in log
    assert done["state"] == "failed" and "code: failed after step 5" in done["reason"], done
    assert json.loads(cli("nodes", "--json").out) == []


def test_a_hang_is_retried_on_the_spare_and_the_guess_is_not_remembered(cli, isolated, slurm_cluster,
                                                                          leftovers_cancelled):
    """SIGSTOP on the ranks: nothing dies and no line names a node, the watchdog ends the hang,
    one node is rotated out blind (and said to be a guess), and the run resumes on the spare."""
    write_spec(isolated, "llama_fo", paced_spec("llama_fo", CHECKPOINTS, 'step_timeout: "00:00:08"',
                                                 step_s=0.25))
    row = submit(cli, "slurm-local", "--spare-nodes", "1")
    state = running_past(cli, row, 25)
    stalled = state["active"][0]
    signal_node(row["native_id"], stalled, signal.SIGSTOP, RANKS)
    done = wait_state(cli, row["id"], timeout=400)
    log = cli("logs", str(row["id"])).out
    assert "[mmm-orch] hung: no step completed in 8s" in log, log[-3000:]
    assert f"[mmm-orch] failover: retired {stalled} at=" in log and "(blind rotation: " in log
    assert "attempt 1/2: hang: the watchdog ended a hang; no node named" in log
    assert done["state"] == "completed" and f"{stalled} retired (blind)" in done["reason"], done
    assert json.loads(cli("nodes", "--json").out) == []  # a guess is not evidence


def test_with_no_spare_left_the_job_stops_and_says_so(cli, isolated, slurm_cluster,
                                                      leftovers_cancelled):
    write_spec(isolated, "llama_fo", SPEC)
    row = submit(cli, "slurm-local", "--spare-nodes", "1")
    first = running_past(cli, row, 25)["active"][0]
    signal_node(row["native_id"], first, signal.SIGKILL, RANKS)
    second = until(lambda: (s := failover_state(row)) and s["attempt"] == 2 and s["active"][0],
                   240, lambda: cli("logs", str(row["id"])).out[-3000:])
    until(lambda: trainer_pids(row["native_id"], second, RANKS)
          and steps(row["run_dir"])[-1]["step"] >= 35, 240, lambda: cli("logs", str(row["id"])).out[-3000:])
    signal_node(row["native_id"], second, signal.SIGKILL, RANKS)
    done = wait_state(cli, row["id"], timeout=300)
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "failed", log[-3000:]
    assert f"attempt 2/2: node: {second} lost its ranks" in log and "no spare node left: stopping" in log
    assert "no spare node left" in done["reason"], done
    assert {n["node"] for n in json.loads(cli("nodes", "--json").out)} == {first, second}


def test_a_cancelled_job_is_not_retried(cli, isolated, slurm_cluster, leftovers_cancelled):
    write_spec(isolated, "llama_fo", SPEC)
    row = submit(cli, "slurm-local", "--spare-nodes", "1")
    running_past(cli, row, 5)
    assert cli("cancel", str(row["id"])).code == 0
    done = wait_state(cli, row["id"], timeout=120)
    log = cli("logs", str(row["id"])).out
    assert done["state"] == "cancelled", done
    assert "attempt 1/2: stopped: the scheduler stopped the job (SIGTERM" in log, log[-3000:]
    assert "attempt=2/2" not in log and json.loads(cli("nodes", "--json").out) == []


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["too few nodes", "unreadable signatures"])
def test_a_failure_of_the_loop_itself_ends_the_job_with_its_own_message(tmp_path, damage):
    (tmp_path / "nodes.txt").write_text("n1\n" if damage == "too few nodes" else "n1\nn2\n")
    if damage == "unreadable signatures":
        (tmp_path / "failures.json").write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(tmp_path), "--machine", "slurm-local",
         "--active", "2", "--node-arg=--nodelist={nodelist}", "--first-step-timeout", "60",
         "--step-timeout", "60", "--", "echo @NODES@"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_INTERNAL_ERROR, proc
    assert proc.stdout.startswith("[mmm-orch] failover: internal error, the job ends: "), proc.stdout


@pytest.mark.slow
def test_the_node_words_reach_the_launcher_as_single_words(tmp_path):
    """The host file lies in the job's directory, which may hold a space or shell syntax: the
    launcher gets it, and the node list, as one word each, and nothing in them runs."""
    job_dir = tmp_path / "run $(touch pwned) `touch pwned2`; x"
    job_dir.mkdir()
    (job_dir / "nodes.txt").write_text("n1\nn2\n")
    show = f"{sys.executable} -c 'import json, sys; print(\"ARGS\", json.dumps(sys.argv[1:]))'"
    proc = subprocess.run(
        [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(job_dir), "--machine", "pbs-local",
         "--active", "2", "--node-arg=-f {hostfile} --nodelist={nodelist}",
         "--first-step-timeout", "60", "--step-timeout", "60", "--", f"{show} @NODES@"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("ARGS "))
    assert json.loads(line[5:]) == ["-f", str(job_dir / "active-hosts.txt"), "--nodelist=n1,n2"]
    assert (job_dir / "active-hosts.txt").read_text() == "n1\nn2\n"
    assert not list(tmp_path.rglob("pwned*")), proc.stdout
