"""Held allocations (`mmm-orch allocate`, `submit --into`): one job that runs the runs sent into it
while it lives, each a job of its own, each started once; near its end it starts no run that
cannot finish, and at its end it gives back what did not finish, to the allocation made after it.

In-process, what is refused before anything is written, and the backlog's mover leaving runs
sent into an allocation alone. Live, once per scheduler: an allocation of two nodes takes five
runs sent one by one from other processes (on Slurm one of them over SSH, through the test
sshd to this host as to a login node), then is cancelled while two of them train, and a second
one made --after it finishes those from their checkpoints, and the run the first could not
finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.jobs import cancel_leftovers
from helpers.schedulers import PBS_BIN

from mmm_orch.records.db import open_db
from mmm_orch.records.record import ALLOCATION, PACK_INDEX
from mmm_orch.schedulers.states import JobState
from mmm_orch.usecases.backlogs import waiting


def _allocation(db, machine: str = "slurm-local", state: str = "running", walltime: int = 300):
    """An allocation's records as `allocate` makes them: its group, and its job in it."""
    group = db.groups.new(ALLOCATION, {"machine": machine, "nodes": 2, "walltime": walltime,
                                       "template": None, "after": None})
    job = db.insert(machine=machine, host="h", scheduler="slurm", commands={}, workload="command",
                    name="a", nodes=2, ranks=2, native_id="7", job_dir="/nonexistent",
                    script_path="", script="", plan={}, submit_dir="", log_path="",
                    submitted_at=time.time(), state=state, group_id=group,
                    group_index=PACK_INDEX)
    return group, job


def test_runs_sent_into_an_allocation_are_not_the_backlogs(tmp_path):
    db = open_db(str(tmp_path / "jobs.db"), create=True)
    group, _ = _allocation(db)
    common = dict(machine="slurm-local", host="h", scheduler="slurm", commands={}, workload="w",
                  name="w", nodes=1, ranks=1, native_id="", job_dir="/nonexistent",
                  script_path="", script="", plan={}, submit_dir="", log_path="",
                  submitted_at=time.time(), state="waiting", waited_since=time.time())
    mine = db.insert(**common)
    db.insert(**common, group_id=group, group_index=1)
    assert [r.id for r in waiting(db)] == [mine]
    assert len(db.list(state=JobState.WAITING)) == 2


def test_usage_counts_an_allocation_once_not_again_through_its_runs(tmp_path):
    from mmm_orch.records.usage import usage

    db = open_db(str(tmp_path / "jobs.db"), create=True)
    group, job = _allocation(db, state="completed")
    run = db.insert(machine="slurm-local", host="h", scheduler="local", commands={},
                    workload="w", name="w", nodes=1, ranks=1, native_id="9",
                    job_dir="/nonexistent", script_path="", script="", plan={}, submit_dir="",
                    log_path="", submitted_at=time.time(), state="completed", group_id=group,
                    group_index=1)
    with db.write():
        db.conn.execute("UPDATE jobs SET charge = ?, ended_at = ? WHERE id = ?", (2.0, 1.0, job))
        db.conn.execute("UPDATE jobs SET charge = ?, ended_at = ? WHERE id = ?", (0.5, 1.0, run))
    (row,) = usage(db)
    assert (row.jobs, row.charged) == (1, 2.0)


@pytest.mark.parametrize("words, field, said", [
    (["--into", "{job}", "-N", "3"], "--nodes", "at most allocation {job}'s 2"),
    (["--into", "{job}", "--walltime", "00:04:31"], "--walltime",
     "at most 00:04:30: allocation {job}'s walltime less 30 s"),
    (["--into", "{other}"], "--into", "the id of an allocation"),
    (["--into", "{job}", "--host", "login"], "", "--host is not for --into"),
])
def test_a_run_an_allocation_could_never_take_is_refused_before_it_is_recorded(
        cli, isolated, words, field, said):
    db = open_db(str(isolated / "jobs.db"), create=True)
    _, job = _allocation(db)
    other = db.insert(machine="slurm-local", host="h", scheduler="slurm", commands={},
                      workload="w", name="w", nodes=1, ranks=1, native_id="8",
                      job_dir="/nonexistent", script_path="", script="", plan={}, submit_dir="",
                      log_path="", submitted_at=time.time(), state="completed")
    before = db.count()
    args = [w.format(job=job, other=other) for w in words]
    made = cli("--db", str(isolated / "jobs.db"), "submit", "slurm-local", *args,
               "--no-env-check", "--", "true")
    assert made.code == 2, (made.out, made.err)
    assert len(made.err.strip().splitlines()) == 1 and field in made.err, made.err
    assert said.format(job=job) in made.err, made.err
    assert open_db(str(isolated / "jobs.db")).count() == before


def test_an_allocation_is_refused_where_no_scheduler_grants_one(cli, isolated):
    made = cli("allocate", "local", "-N", "1", "--walltime", "00:05:00")
    assert made.code == 2 and "allocate: machine local runs its jobs on this computer" in made.err
    assert not (isolated.parent / "state" / "mmm-orch" / "jobs.db").exists()


def test_an_allocations_script_holds_it_on_its_first_node(cli, isolated):
    made = cli("allocate", "slurm-local", "-N", "2", "--walltime", "00:10:00", "--dry-run")
    assert made.code == 0, made.err
    assert "#SBATCH --nodes=2" in made.out and "#SBATCH -t 00:10:00" in made.out
    held = [line for line in made.out.splitlines() if line.endswith(" hold '<allocation group>'")]
    assert held and not held[-1].startswith(("srun", "echo")), held  # once, not launched


# A program that keeps the runtime contract (docs/runtime.md): a step a second, each saved; asked
# to stop (SIGTERM, SIGUSR1) it ends the step it is in, saves, and exits 75; it resumes from the
# run's checkpoint.
STEADY = """
import signal, sys, time
from mmm_orch import runtime
asked = []
for signum in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(signum, lambda signum, frame: asked.append(signum))
saved = runtime.latest_checkpoint()
step = saved.step if saved else 0
if saved:
    print(f"resumed_step={step}", flush=True)
while step < 12:
    time.sleep(1.0)
    step += 1
    runtime.report_step(step, loss=1.0 / step)
    runtime.checkpoint_path(step).mkdir(parents=True, exist_ok=True)
    runtime.checkpoint_saved(step)
    if asked:
        sys.exit(runtime.EXIT_CHECKPOINTED)
"""


def _mmm(*args: str, env: dict | None = None) -> dict:
    """`mmm-orch ARGS --json` in a process of its own (the interpreter of the tests' venv)."""
    cut = args.index("--") if "--" in args else len(args)
    proc = subprocess.run([sys.executable, "-m", "mmm_orch", *args[:cut], "--json", *args[cut:]],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _rows() -> dict[int, dict]:
    rows = _mmm("status", "--all")
    return {row["id"]: row for row in rows}


def _until(what, seconds: float, said):
    deadline = time.monotonic() + seconds
    while not (found := what()):
        assert time.monotonic() < deadline, said()
        time.sleep(1)
    return found


def _steps(run_dir: str) -> list[int]:
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()
            if '"event": "step"' in line]


@pytest.mark.live
@pytest.mark.parametrize("machine", ["slurm-local", "pbs-local"])
def test_an_allocation_takes_runs_one_by_one_and_the_next_finishes_what_it_gave_back(
        request, isolated, monkeypatch, tmp_path, machine):
    request.getfixturevalue("slurm_cluster" if machine == "slurm-local" else "pbs_server")
    request.addfinalizer(cancel_leftovers)
    if machine == "pbs-local":
        monkeypatch.setenv("PATH", PBS_BIN + os.pathsep + os.environ["PATH"])
    db = str(Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db")  # (cancel_leftovers')
    (isolated / ".mmm-orch" / "workloads").mkdir(parents=True)
    (isolated / ".mmm-orch" / "workloads" / "mine.yaml").write_text(
        "name: mine\nresumable: true\n")
    steady = isolated / "steady.py"
    steady.write_text(STEADY)

    first = _mmm("allocate", machine, "-N", "2", "--walltime", "00:05:00")["id"]
    into = ["--into", str(first), "--walltime"]
    # Five runs, each sent by a process of its own: two short commands (exit 0 and 3), two
    # trainings of 12 steps, and one whose walltime the allocation cannot leave it.
    quick = _mmm("submit", machine, *into, "00:01:00", "--", "sh", "-c", "sleep 2; exit 0")["id"]
    if machine == "slurm-local":  # over SSH, as from a laptop to the login node
        sshd = request.getfixturevalue("sshd")
        from helpers.ssh import ssh_config
        ssh_config(Path(os.environ["HOME"]), sshd)
        remote = subprocess.run(
            ["ssh", "-F", str(Path(os.environ["HOME"]) / ".ssh" / "config"), "login",
             f"cd {isolated} && PATH={os.environ['PATH']} {sys.executable} -m mmm_orch --db {db} "
             f"submit {machine} --into {first} --walltime 00:01:00 --json -- sh -c "
             "'sleep 2; exit 3'"], capture_output=True, text=True, timeout=120)
        assert remote.returncode == 0, remote.stderr
        failing = json.loads(remote.stdout)["id"]
    else:
        failing = _mmm("submit", machine, *into, "00:01:00", "--", "sh", "-c", "sleep 2; exit 3")["id"]
    trainings = [_mmm("submit", machine, "mine", *into, "00:03:00", "--", sys.executable,
                      str(steady))["id"]
                 for _ in range(2)]
    late = _mmm("submit", machine, *into, "00:04:30", "--", "true")["id"]

    def trained() -> bool:
        rows = _rows()
        return all(len(_steps(rows[run]["run_dir"] or "")) >= 3 for run in trainings)
    _until(trained, 240, _rows)
    rows = _rows()
    assert rows[quick]["state"] == "completed" and rows[quick]["exit_code"] == 0, rows[quick]
    assert rows[failing]["state"] == "failed" and rows[failing]["exit_code"] == 3, rows[failing]
    assert rows[quick]["log_path"] != rows[failing]["log_path"]
    assert rows[late]["state"] == "waiting" and "not started in allocation" in rows[late]["reason"]
    spans = [(rows[r]["started_at"], rows[r]["ended_at"] or time.time())
             for r in (quick, failing, *trainings)]
    at_once = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert at_once <= 2, spans

    # The next allocation (from Python, as a notebook holds one) waits for the nodes; the first
    # is cancelled while the two train.
    import mmm_orch
    held = mmm_orch.allocate(machine, nodes=2, walltime="00:06:00", after=first)
    second = held.id
    subprocess.run([sys.executable, "-m", "mmm_orch", "cancel", str(first)], check=True,
                   capture_output=True, timeout=120)

    def finished():
        rows = _rows()
        again = [r for r in rows.values() if r.get("rerun_of") in trainings]
        runs = again + [rows[late]]
        return (rows, again) if len(again) == 2 and all(
            r["state"] == "completed" for r in runs) else None
    rows, again = _until(finished, 300, _rows)
    assert all(rows[run]["state"] == "cancelled" for run in trainings), rows
    second_group = rows[second]["group_id"]
    assert {r["group_id"] for r in again} == {second_group} == {rows[late]["group_id"]}
    for run in again:  # each step once: the second part went on from the first's checkpoint
        assert _steps(run["run_dir"]) == list(range(1, 13)), run
        log = Path(run["log_path"]).read_text()
        assert "resumed_step=" in log, log
    assert rows[first]["state"] == "cancelled"
    assert [job.id for job in held.runs()] == [late] + [r["id"] for r in again]
    held.cancel()
    assert held.wait(timeout=120).job.state == "cancelled"
