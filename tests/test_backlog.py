"""The backlog: runs that wait their turn on the user's side (`--backlog`), each recorded from the
start, submitted exactly once as the queue's job limits admit it, by whichever mover runs
(`mmm-orch backlog`, `status`), movers killed and movers at once included.

In-process, the database's backlog (records/waiting.py) under real SQLite from several
processes. Live, once per scheduler, on the test servers' `backlog` queue (1 job per user in
any state, which the scheduler enforces: scripts/slurm-cluster.sh, scripts/pbs-server.sh), whose
jobs run: six runs one at a time, the first mover SIGKILLed right after the scheduler took one
of its runs, then two movers at once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.jobs import cancel_leftovers
from helpers.schedulers import PBS_BIN

from mmm_orch.records.db import open_db
from mmm_orch.schedulers.pbs import parse as pbs_parse
from mmm_orch.schedulers.slurm import parse as slurm_parse
from mmm_orch.schedulers.states import JobState
from mmm_orch.usecases.backlogs import queues
from mmm_orch.submission.submit import cancel


FIXTURES = Path(__file__).parent / "fixtures"


def _waiting(db, machine: str = "m", queue: str = "q", **extra) -> int:
    return db.insert(machine=machine, host="h", scheduler="slurm", commands={}, workload="w",
                     name="w", nodes=1, ranks=1, native_id="", job_dir="/nonexistent",
                     script_path="", script="", plan={"queue": {"name": queue}}, submit_dir="",
                     log_path="", submitted_at=time.time(), state="waiting",
                     waited_since=time.time(), **extra)


def test_a_waiting_run_leaves_the_backlog_once(tmp_path):
    db = open_db(str(tmp_path / "jobs.db"), create=True)
    first, second = _waiting(db), _waiting(db)
    assert [r.id for r in db.list(state=JobState.WAITING)] == [first, second]
    assert db.backlog.claim(first, "me") and not db.backlog.claim(first, "another")
    assert db.get(first).state is JobState.SUBMITTING
    assert not db.backlog.withdraw(first, "too late")  # claimed: not waiting any more
    # the scheduler never took it: back in its place, before the second
    assert db.backlog.requeue(first, "back in the backlog: never sent")
    assert [r.id for r in db.list(state=JobState.WAITING)] == [first, second]
    assert db.get(first).reason == "back in the backlog: never sent"
    # cancel takes a waiting run out, unsubmitted, and a mover can no longer claim it
    cancel(db, db.get(second))
    assert db.get(second).state is JobState.CANCELLED and not db.backlog.claim(second, "me")
    # a job submitted at once never goes back to a backlog it was never in
    direct = db.insert(**{**_values(db.get(first)), "state": "submitting", "waited_since": None})
    assert not db.backlog.requeue(direct, "no")


def _values(record) -> dict:
    data = record.to_dict(full=True)
    for key in ("id", "events", "checked_at", "state"):
        data.pop(key)
    return data


CLAIM_ALL = """
import json, sys
from mmm_orch.records.db import open_db
from mmm_orch.schedulers.pbs import parse as pbs_parse
from mmm_orch.schedulers.slurm import parse as slurm_parse
db = open_db(sys.argv[1])
print(json.dumps([job for job in json.loads(sys.argv[2]) if db.backlog.claim(job, sys.argv[3])]))
"""


@pytest.mark.slow
def test_runs_claimed_from_four_processes_at_once_are_each_taken_once(tmp_path):
    path = str(tmp_path / "jobs.db")
    db = open_db(path, create=True)
    ids = [_waiting(db) for _ in range(40)]
    movers = [subprocess.Popen([sys.executable, "-c", CLAIM_ALL, path, json.dumps(ids),
                                f"mover {n}"], stdout=subprocess.PIPE, text=True)
              for n in range(4)]
    everyone = [job for mover in movers for job in json.loads(mover.communicate(timeout=60)[0])]
    assert sorted(everyone) == ids  # every run once, none twice


def test_one_mover_holds_the_lease_until_it_ends_or_it_runs_out(tmp_path):
    db = open_db(str(tmp_path / "jobs.db"), create=True)
    alive = lambda holder: False  # noqa: E731
    assert db.backlog.lease("a", 60, alive)
    assert not db.backlog.lease("b", 60, alive)  # a holds it
    assert db.backlog.lease("a", 60, alive)  # renewed
    assert db.backlog.lease("b", 60, lambda holder: holder == "a")  # a's process is gone
    db.backlog.release("b")
    assert db.backlog.lease("c", 0.2, alive)
    time.sleep(0.3)
    assert db.backlog.lease("d", 60, alive)  # c's ran out


def test_runs_wait_by_queue_in_the_order_they_came(tmp_path):
    db = open_db(str(tmp_path / "jobs.db"), create=True)
    ids = [_waiting(db, queue="a"), _waiting(db, queue="b"), _waiting(db, queue="a"),
           _waiting(db, machine="n", queue="a")]
    grouped = queues([db.get(i) for i in ids])
    assert [[r.id for r in group] for group in grouped] == [[ids[0], ids[2]], [ids[1]], [ids[3]]]


def test_a_refusal_for_a_job_count_limit_is_told_from_the_others():
    """Said in the schedulers' own words (recorded: the live test servers, ALCF's guide): a
    run the backlog sent is put back for these, and fails for the others."""
    slurm = json.loads((FIXTURES / "slurm" / "sbatch_err_qos_max_submit_limit.json").read_text())
    assert slurm_parse.OVER_LIMIT.search(slurm["stderr"])
    assert not slurm_parse.OVER_LIMIT.search(
        "sbatch: error: Batch job submission failed: Invalid account or account/partition "
        "combination specified")
    catalog = json.loads((FIXTURES / "pbs" / "pbs_error_messages_catalog.json").read_text())
    limits = [e["text"] for e in catalog if e["command"] == "qsub" and pbs_parse.OVER_LIMIT.search(
        e["text"])]
    assert limits == ["qsub: would exceed queue generic's per-user limit"]
    refusals = json.loads((FIXTURES / "pbs" / "live_qsub_refusals.json").read_text())
    assert not any(pbs_parse.OVER_LIMIT.search(r["stderr"]) for r in refusals)


# --- live: six runs on a queue of one job per user ---------------------------------------------

# The backlog queues hold one job of the user's (root's, for every test): the tests that use them
# run one after another, on one worker.
BACKLOG_QUEUE = pytest.mark.xdist_group("backlog-queue")

# A submit command that calls the real one, logs its exit, and once (the first time a mover,
# `mmm-orch backlog`, calls it for a third submission or later) kills that mover right after the
# scheduler took the job: the record is left `submitting`, for the next mover to settle.
WRAPPER = r"""#!/bin/bash
count=$(( $(cat "$STATE/calls" 2>/dev/null || echo 0) + 1 )); echo $count > "$STATE/calls"
if [[ $count -ge 3 && ! -e $STATE/killed ]] && ps -o args= -p $PPID | grep -q -- 'mmm_orch backlog --every'; then
    out=$("$REAL" "$@"); rc=$?; echo "$rc" >> "$STATE/exits"; echo "$out"
    touch "$STATE/killed"; kill -9 $PPID; exit $rc
fi
"$REAL" "$@"; rc=$?; echo "$rc" >> "$STATE/exits"; exit $rc
"""
RUN = os.urandom(3).hex()  # job names unique to this run: the schedulers remember ended jobs


def _scheduler_jobs(kind: str, name: str) -> list[str]:
    """The jobs of this name the scheduler has, ended ones included (its own record)."""
    if kind == "slurm":
        out = subprocess.run(["sacct", "-X", "-n", "-P", "--name", name, "-S", "now-1hour", "-o",
                              "JobID"], capture_output=True, text=True, check=True).stdout
        return out.split()
    return subprocess.run([f"{PBS_BIN}/qselect", "-x", "-N", name], capture_output=True,
                          text=True, check=True).stdout.split()


def _mmm(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmm_orch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _rows(name: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "mmm_orch", "status", "--all", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [r for r in json.loads(proc.stdout) if r["name"] == name]


@pytest.mark.live
@BACKLOG_QUEUE
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_six_runs_go_one_at_a_time_each_once_through_a_killed_mover_and_two_at_once(
        request, isolated, monkeypatch, tmp_path, kind):
    request.getfixturevalue("slurm_cluster" if kind == "slurm" else "pbs_server")
    request.addfinalizer(cancel_leftovers)
    machine = f"{kind}-backlog"
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    base = "slurm-local" if kind == "slurm" else "pbs-local"
    commands = "" if kind == "slurm" else \
        "scheduler: {commands: {submit: qsub, query: qstat, cancel: qdel}}\n"
    (machines / f"{machine}.yaml").write_text(f"extends: {base}\nname: {machine}\n{commands}")
    bin_dir, state = tmp_path / "bin", tmp_path / "wrapper-state"
    bin_dir.mkdir()
    state.mkdir()
    real = "/usr/bin/sbatch" if kind == "slurm" else f"{PBS_BIN}/qsub"
    wrapper = bin_dir / Path(real).name
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    extra = PBS_BIN + os.pathsep if kind == "pbs" else ""
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{extra}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(state))
    monkeypatch.setenv("REAL", real)
    name = f"wait{RUN}"

    # Six runs, each a job of a few seconds: three submitted, then a sweep of three; the first
    # goes at once, the others wait.
    for _ in range(3):
        proc = _mmm("submit", machine, "-q", "backlog", "--backlog", "--name", name,
                    "--walltime", "00:05:00", "--", "sleep", "3")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    proc = _mmm("sweep", machine, "-q", "backlog", "--backlog", "--name", name, "--nodes",
                "1,2,3", "--walltime", "00:05:00", "--", "sleep", "3")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    # (the first job may end meanwhile, and the sweep's move then submits the second run)
    assert re.search(r"3 jobs, 4-6: [01] submitted, [23] waiting in the backlog", out), out
    rows = _rows(name)
    assert len(rows) == 6 and sum(1 for r in rows if r["state"] == "waiting") >= 4, rows
    assert any("2nd in the backlog: queue backlog takes 1" in r["reason"] for r in rows), rows

    # The first mover is killed right after the scheduler took one of its runs; then two at once.
    first = _mmm("backlog", "--every", "1", "--for", "600")
    first.communicate(timeout=600)
    assert first.returncode == -signal.SIGKILL and (state / "killed").exists()
    movers = [_mmm("backlog", "--every", "1", "--for", "600") for _ in range(2)]
    for mover in movers:
        out, err = mover.communicate(timeout=660)
        assert mover.returncode == 0, err
    deadline = time.monotonic() + 300
    while not all(r["state"] in ("completed", "failed", "cancelled") for r in _rows(name)):
        assert time.monotonic() < deadline, _rows(name)
        time.sleep(2)
    rows = _rows(name)

    # Six jobs, each once, all completed, none refused; the scheduler agrees.
    assert [r["state"] for r in rows] == ["completed"] * 6, rows
    ids = sorted(r["native_id"] for r in rows)
    assert len(set(ids)) == 6 and sorted(_scheduler_jobs(kind, name)) == ids
    assert set((state / "exits").read_text().split()) == {"0"}  # never a scheduler refusal
    # one at a time: each started after the one before ended
    spans = sorted((r["started_at"], r["ended_at"]) for r in rows)
    assert all(later[0] >= earlier[1] - 1 for earlier, later in zip(spans, spans[1:])), spans


# A program that keeps the runtime contract (docs/runtime.md) in two steps a link: it resumes
# from the run's checkpoint, reports its steps, saves, and exits 75 until step 8, then 0.
TWO_STEPS_A_LINK = """
import sys
from mmm_orch import runtime
saved = runtime.latest_checkpoint()
first = saved.step + 1 if saved else 1
last = min(8, first + 1)
for step in range(first, last + 1):
    runtime.report_step(step, loss=1.0 / step)
runtime.checkpoint_path(last).mkdir(parents=True, exist_ok=True)
runtime.checkpoint_saved(last)
sys.exit(0 if last == 8 else runtime.EXIT_CHECKPOINTED)
"""


@pytest.mark.live
@BACKLOG_QUEUE
@pytest.mark.parametrize("machine", ["slurm-local", "pbs-local"])
def test_a_four_link_chain_on_a_queue_of_one_job_reaches_its_last_step(request, isolated,
                                                                       monkeypatch, machine):
    """Through the Python API: the links wait in the backlog, not in the queue (which holds one
    job), each submitted once the one before ended, each resuming from its checkpoint; every
    step once. Waiting on the last link moves the backlog."""
    import mmm_orch

    request.getfixturevalue("slurm_cluster" if machine == "slurm-local" else "pbs_server")
    request.addfinalizer(cancel_leftovers)
    if machine == "pbs-local":
        monkeypatch.setenv("PATH", PBS_BIN + os.pathsep + os.environ["PATH"])
    (isolated / ".mmm-orch" / "workloads").mkdir(parents=True)
    (isolated / ".mmm-orch" / "workloads" / "mine.yaml").write_text(
        "name: mine\nresumable: true\n")
    program = isolated / "two_steps_a_link.py"
    program.write_text(TWO_STEPS_A_LINK)
    links = mmm_orch.submit(machine, "mine", command=[sys.executable, str(program)],
                            chain=4, backlog=True, queue="backlog", walltime="00:05:00")
    assert [j.state for j in links][1:] == ["waiting"] * 3, links
    assert links[-1].wait(timeout=600, poll=1).state == "completed", links[-1].logs()
    ended = mmm_orch.refresh(links)
    assert [j.state for j in ended] == ["timeout"] * 3 + ["completed"], ended
    spans = [(j.record.started_at, j.record.ended_at) for j in ended]
    assert all(later[0] >= earlier[1] - 1 for earlier, later in zip(spans, spans[1:])), spans
    metrics = Path(links[0].run_dir) / "metrics.jsonl"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()
             if '"event": "step"' in line]
    assert steps == list(range(1, 9))  # every step once, each link going on from the last
    for link in ended[1:]:
        assert "resumed_step=" in link.logs(), link.logs()


@pytest.mark.live
@BACKLOG_QUEUE
@pytest.mark.usefixtures("slurm_cluster")
def test_runs_wait_and_go_in_over_ssh(cli, isolated, sshd, tmp_path, request):
    """Submitted and moved through a login host (the test sshd before the Slurm cluster): the
    queue counted and the runs submitted there, one at a time."""
    from helpers.ssh import machine_through_login

    request.addfinalizer(cancel_leftovers)
    machine = machine_through_login(isolated, sshd, "slurm-local", tmp_path / "remote-jobs")
    for _ in range(3):
        made = cli("submit", machine, "-q", "backlog", "--backlog", "--host", "login",
                   "--walltime", "00:05:00", "--json", "--", "sleep", "2")
        assert made.code == 0, made.err
    moved = cli("backlog", "--every", "1", "--for", "300")
    assert moved.code == 0 and "the backlog is empty" in moved.out, (moved.out, moved.err)
    deadline = time.monotonic() + 120
    while True:
        rows = json.loads(cli("status", "--all", "--json").out)
        if all(r["state"] in ("completed", "failed", "cancelled") for r in rows):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(1)
    assert [r["state"] for r in rows] == ["completed"] * 3 and {r["remote"] for r in rows} == \
        {"login"}, rows
    assert len({r["native_id"] for r in rows}) == 3
    spans = sorted((r["started_at"], r["ended_at"]) for r in rows)
    assert all(later[0] >= earlier[1] - 1 for earlier, later in zip(spans, spans[1:])), spans
