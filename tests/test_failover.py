"""Failover inside a job. Live, once on each scheduler (Slurm and PBS): the ranks of one node
SIGKILLed, the node is retired and remembered, a spare takes its place, training resumes from the
last checkpoint with the same losses, and the next job keeps off the node. In-process, the loop
itself (a real process around a launcher that prints what srun prints) for every other row of the
classification table in docs/guides/node-failures.md: a bad option, an exception after steps,
the walltime stop, a node lost as the walltime ends (none retried), a hang (retried, blind), a
second node lost with no spare left, a cancel; and what `status` and `nodes` make of each. And
the loop's own failure ends the job loudly."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.faults import signal_node
from helpers.jobs import TERMINAL, wait_state
from helpers.profiles import paced_spec, write_spec
from mmm_orch.injob.protocol import EXIT_INTERNAL_ERROR
from mmm_orch.records.db import JobDB
from mmm_orch.runtime.metrics import parse_line

# Tiny Llama 3 on 4 CPU ranks, a checkpoint every 10 steps, each step lasting 0.25 s or more
# (a quiet host's take 0.1 s): a kill after step 45 of 150 comes in the middle on any host.
STEPS = 150
SPEC = paced_spec("llama_fo", f"checkpoint_every: 10, steps: {STEPS}", step_s=0.25)
RANKS = "paced_llama3"  # the module its ranks run, by which the tests find them
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
    assert (done["end_class"], done["end_node"]) == ("node-lost", victim), done

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
        result = cli("submit", machine, "--nodes", "2", "--json", "--", "true")
        assert result.code == 0, result.err
        after_row = json.loads(result.out)
        wait_state(cli, after_row["id"])
        # Accounting records a job's end a moment after the controller: read its node list once
        # it has. A cluster set up again within the hour gives its ids again: of the rows of
        # that id, the latest submitted is this job's.
        deadline = time.monotonic() + 60
        while True:
            rows = subprocess.run(["sacct", "-j", after_row["native_id"], "-X", "-n", "-P", "-S",
                                   "now-1hour", "-o", "Submit,NodeList,State"],
                                  capture_output=True, text=True, timeout=30).stdout.split()
            row = max(rows, default="")
            if row.endswith("|COMPLETED") or time.monotonic() > deadline:
                break
            time.sleep(1)
        used = row.split("|")[1]
        expanded = subprocess.run(["scontrol", "show", "hostnames", used], capture_output=True,
                                  text=True, timeout=30).stdout.split()
        assert len(expanded) == 2 and victim not in expanded, used
    else:  # PBS cannot exclude a vnode: the script names it for the loop, which uses it last
        script = cli("submit", machine, "llama_fo", "--nodes", "2", "--spare-nodes", "1",
                     "--dry-run").out  # (test_known_bad_nodes_are_launched_on_last: the loop)
        assert f"--avoid={shlex.quote(victim)}" in script, script
    assert cli("nodes", "forget", victim).code == 0
    assert json.loads(cli("nodes", "--json").out) == []


# -- the loop's other verdicts, in-process ------------------------------------------------------
# The live tests above prove, once per scheduler, that a node's killed ranks are named, the node
# retired and remembered, and the run resumed on the spare. How the loop judges every other end
# of an attempt, and what `status` and `nodes` then say, runs here: the real loop (the job's own
# process, its stdout the job's log) around a launcher that prints what srun and the ranks print
# (the words of the live jobs' logs) and ends as they do, on one active node and one spare as a
# job of `--spare-nodes 1` has; then the real tracking reads the job's directory.

LAUNCHER = """nodes=${1#--nodelist=}
node=${nodes##*,}
"""
KILLED = 'echo "srun: error: $node: tasks 0-1: Killed" >&2; exit 137\n'


def loop_argv(job_dir: Path, launcher: str, *options: str) -> list[str]:
    """The failover loop as the job script runs it on nodes n1 and n2 (one active, one spare)
    around `launcher` (bash, the launch line's words in $1)."""
    (job_dir / "nodes.txt").write_text("n1\nn2\n")
    (job_dir / "launch.sh").write_text(LAUNCHER + launcher)
    return [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(job_dir), "--machine",
            "slurm-local", "--active", "1", "--node-arg=--nodelist={nodelist}",
            "--first-step-timeout", "60", "--step-timeout", "60", "--grace", "5", *options, "--",
            f"bash {shlex.quote(str(job_dir / 'launch.sh'))} @NODES@"]


def run_loop(job_dir: Path, launcher: str, *options: str) -> str:
    """Run the loop to its end; the job's log."""
    job_dir.mkdir(exist_ok=True)
    with open(job_dir / "job.log", "ab") as log:
        subprocess.run(loop_argv(job_dir, launcher, *options), stdout=log,
                       stderr=subprocess.STDOUT, timeout=120)
    return (job_dir / "job.log").read_text()


def as_mmm_orch_shows_it(cli, job_dir: Path, exit_code: int | None,
                         cancelled: bool = False) -> tuple[dict, list[dict]]:
    """The job's `status` row and the remembered `nodes`, once the job whose directory is
    `job_dir` (spare nodes: its failover.json and outcome file) ended with `exit_code`: a job
    the records hold as running, whose end its local supervisor recorded."""
    (job_dir / "result.json").write_text(json.dumps({
        "exit_code": exit_code, "signal": None, "cancelled": cancelled, "timed_out": False,
        "ended_at": time.time()}))
    db = JobDB(Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db")
    job = db.insert(
        machine="local", host="h", scheduler="local", commands={}, workload="w", name="w",
        nodes=1, ranks=1, native_id=job_dir.name, job_dir=str(job_dir), script_path="s",
        script="", plan={}, submit_dir=str(job_dir), git_commit=None,
        log_path=str(job_dir / "job.log"), submitted_at=time.time(), state="running", spares=1)
    row = json.loads(cli("status", str(job), "--json").out)[0]
    return row, json.loads(cli("nodes", "--json").out)


def test_a_bad_option_fails_at_start_and_is_not_retried(cli, isolated):
    """The trainer refuses an option before its first step (llama3.py's own words, as the live
    job printed them): the request's fault, which a spare would not mend."""
    log = run_loop(isolated / "job", 'echo "llama3.py: error: unrecognized arguments: --bogus 1" >&2\n'
                   'echo "srun: error: $node: tasks 0-1: Exited with exit code 2" >&2; exit 2\n')
    assert ("attempt 1/2: start: failed before its first step (trainer-usage-error: llama3.py: "
            "error: unrecognized arguments: --bogus 1)") in log, log
    assert "attempt=2/2" not in log and "retired" not in log
    done, nodes = as_mmm_orch_shows_it(cli, isolated / "job", 2)
    assert done["state"] == "failed" and "start: failed before its first step" in done["reason"], done
    assert done["end_class"] == "no-first-step" and nodes == []


@pytest.mark.slow
def test_the_walltime_ends_the_run_and_is_not_retried(cli, isolated):
    """The watchdog's stop before the walltime: the ranks save and exit 75, and the loop stops
    there, resumable, with the spare unused."""
    log = run_loop(isolated / "job", "trap 'echo \"[checkpoint] step=12 path=run/checkpoints/step-12 "
                   "save_s=0.1 blocking_s=0.1 reason=signal\"; exit 75' USR1\n"
                   "echo step=12 loss=0.5; sleep 600 & wait\n",
                   # the stop 15 s on: a loaded host's start of the loop must not pass it
                   "--walltime-end", str(time.time() + 40), "--margin", "25")
    assert "attempt 1/2: checkpointed: saved a checkpoint before the walltime" in log, log
    assert "attempt=2/2" not in log
    done, _ = as_mmm_orch_shows_it(cli, isolated / "job", 75)
    assert done["state"] == "timeout" and done["reason"].startswith("resumable at step 12"), done
    assert done["end_class"] == "walltime"


def test_a_node_lost_as_the_walltime_ends_is_not_retried(cli, isolated):
    """A node fault with under 30 s of walltime left: a relaunch could not reach a step."""
    log = run_loop(isolated / "job", "echo step=5 loss=0.5\n" + KILLED,
                   "--walltime-end", str(time.time() + 28), "--margin", "2")
    assert "attempt 1/2: walltime: the walltime is spent" in log, log
    assert "attempt=2/2" not in log and "retired" not in log
    done, nodes = as_mmm_orch_shows_it(cli, isolated / "job", 137)
    assert done["state"] == "failed" and "walltime: the walltime is spent" in done["reason"], done
    # Not retried for want of time, but a node was lost: remembered, and a rerun leaves it out.
    assert (done["end_class"], done["end_node"]) == ("node-lost", "n1"), done
    assert [n["node"] for n in nodes] == ["n1"]


def test_an_exception_after_steps_is_the_code_and_is_not_retried(cli, isolated):
    log = run_loop(isolated / "job", "for step in 1 2 3 4 5; do echo step=$step loss=0.5; done\n"
                   'echo "Traceback (most recent call last):" >&2\n'
                   'echo "RuntimeError: the loss is nan at step 5" >&2\n'
                   'echo "srun: error: $node: task 0: Exited with exit code 1" >&2; exit 1\n')
    assert "attempt 1/2: code: failed after step 5 (" in log and "the loss is nan" in log, log
    assert "attempt=2/2" not in log and "retired" not in log
    done, nodes = as_mmm_orch_shows_it(cli, isolated / "job", 1)
    assert done["state"] == "failed" and "code: failed after step 5" in done["reason"], done
    assert done["end_class"] == "crash" and "the loss is nan" in done["end_evidence"], done
    assert nodes == []


@pytest.mark.slow
def test_a_hang_is_retried_on_the_spare_and_the_guess_is_not_remembered(cli, isolated):
    """Nothing dies and no line names a node: the watchdog ends the hang (srun then reports the
    ranks its stop killed, which is no evidence), one node is rotated out blind (and said to be
    a guess), and the run resumes on the spare."""
    log = run_loop(isolated / "job", 'if [ "$MMM_ORCH_RESUME" = 1 ]; then '
                   "echo step=11 loss=0.4; echo step=12 loss=0.4; exit 0; fi\n"
                   "trap '" + KILLED.strip().replace("exit 137", "exit 143") + "' TERM\n"
                   "echo step=10 loss=0.5; sleep 600 & wait\n", "--step-timeout", "2")
    assert "[mmm-orch] hung: no step completed in 2s" in log, log
    assert "[mmm-orch] failover: retired n1 at=" in log and "(blind rotation: " in log
    assert "attempt 1/2: hang: the watchdog ended a hang; no node named" in log
    assert "attempt=2/2" in log and "active=n2" in log and "attempt 2/2: success" in log
    done, nodes = as_mmm_orch_shows_it(cli, isolated / "job", 0)
    assert done["state"] == "completed" and "n1 retired (blind)" in done["reason"], done
    assert done["end_class"] == "completed" and nodes == []  # a guess is not evidence


def test_with_no_spare_left_the_job_stops_and_says_so(cli, isolated):
    """The ranks of the active node are killed in each attempt: n1, then its spare n2; both
    retired on evidence, and the loop stops with no spare left."""
    log = run_loop(isolated / "job", "echo step=30 loss=0.5\n" + KILLED)
    assert "attempt 1/2: node: n1 lost its ranks" in log and "active=n2" in log, log
    assert "attempt 2/2: node: n2 lost its ranks" in log and "no spare node left: stopping" in log
    done, nodes = as_mmm_orch_shows_it(cli, isolated / "job", 137)
    assert done["state"] == "failed" and "no spare node left" in done["reason"], done
    assert (done["end_class"], done["end_node"]) == ("node-lost", "n2"), done
    assert {n["node"] for n in nodes} == {"n1", "n2"}


@pytest.mark.slow
def test_a_cancelled_job_is_not_retried(cli, isolated):
    """The scheduler's SIGTERM (scancel, qdel) reaches the loop while the launch runs."""
    job_dir = isolated / "job"
    job_dir.mkdir()
    argv = loop_argv(job_dir, "trap 'exit 143' TERM\necho step=5 loss=0.5; sleep 600 & wait\n")
    with open(job_dir / "job.log", "ab") as log:
        loop = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:  # the step passed through the loop: it watches the launch, its signals handled
        until(lambda: "step=5" in (job_dir / "job.log").read_text(), 60,
              lambda: (job_dir / "job.log").read_text())
        loop.send_signal(signal.SIGTERM)
        assert loop.wait(timeout=60) == 143
    finally:
        loop.kill()
    log = (job_dir / "job.log").read_text()
    assert "attempt 1/2: stopped: the scheduler stopped the job (SIGTERM" in log, log
    assert "attempt=2/2" not in log
    done, nodes = as_mmm_orch_shows_it(cli, job_dir, None, cancelled=True)
    assert done["state"] == "cancelled" and done["end_class"] == "cancelled" and nodes == [], done


def test_known_bad_nodes_are_launched_on_last(isolated):
    """PBS cannot keep a job off a node: the job script names the remembered ones (--avoid, see
    the live test) and the loop makes them the spares, used only when nothing else is left."""
    job_dir = isolated / "job"
    job_dir.mkdir()
    (job_dir / "nodes.txt").write_text("vm[1]\nvm[0]\nvm[2]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mmm_orch.injob.failover", "--dir", str(job_dir), "--machine",
         "pbs-local", "--active", "2", "--node-arg=-f {hostfile}", "--avoid=vm[1]",
         "--first-step-timeout", "60", "--step-timeout", "60", "--", "echo step=1 @NODES@"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    attempt = next(line for line in proc.stdout.splitlines()
                   if line.startswith("[mmm-orch] attempt=1/2"))
    assert attempt.endswith("active=vm[0],vm[2] spares=vm[1]"), attempt


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
