"""The embedded default: `submit local ...` runs here, detached, tracked in the job database."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.cli import run_cli
from helpers.jobs import assert_nothing_recorded
from helpers.profiles import PACED_SPEC, write_probe, write_spec

from mmm_orch.hosts import LocalHost
from mmm_orch.injob.protocol import EXIT_STOPPED_BY_TERM, RESULT_FILE
from mmm_orch.records.db import JobDB, open_db
from mmm_orch.schedulers.local.supervisor import GRACE_S


def wait_terminal(cli, job: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cli("status", str(job), "--json")
        assert result.code == 0, result.err
        row = json.loads(result.out)[0]
        if row["state"] in ("completed", "failed", "cancelled", "timeout"):
            return row
        time.sleep(0.5)
    raise AssertionError(f"job {job} not terminal after {timeout}s: {row}")


def wait_state(cli, job: int, states: tuple[str, ...], timeout: float = 120) -> dict:
    row = wait_terminal(cli, job, timeout)
    assert row["state"] in states, row
    return row


def wait_running(cli, job: int, marker: Path | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = json.loads(cli("status", str(job), "--json").out)[0]
        if row["state"] == "running" and (marker is None or marker.exists()):
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not start running")


def db_path() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"


@pytest.mark.slow
def test_dist_check_runs_detached_and_is_tracked(cli, isolated):
    # A separate process submits and exits; the job must outlive it.
    proc = run_cli("submit", "local", "dist_check", "--set", "sizes=4,65536")
    assert proc.returncode == 0, proc.stderr
    assert "submitted job 1: dist_check on local" in proc.stdout
    row = wait_terminal(cli, 1)
    assert (row["state"], row["exit_code"]) == ("completed", 0)
    assert row["started_at"] and row["ended_at"] >= row["started_at"]

    log = cli("logs", "1")
    assert log.code == 0
    for rank in (0, 1):
        assert f"[dist_check] rank={rank} all_reduce OK (got 3, expected 3)" in log.out
    assert "[dist_check] PASS world=2" in log.out and "exit_code=0" in log.out

    shown = cli("show", "1")
    assert "state:       completed" in shown.out and "history:" in shown.out
    script = Path(json.loads(cli("show", "1", "--json").out)["script_path"]).read_text()
    assert script in shown.out and "mmm_orch.trainers.dist_check" in script
    record = json.loads(cli("show", "1", "--json").out)
    assert [e["state"] for e in record["events"]][:2] == ["submitting", "pending"]
    assert record["events"][-1]["state"] == "completed"
    assert record["plan"]["machine"] == "local" and record["submit_dir"] == str(isolated)

    table = cli("status")
    assert table.code == 0
    header, line = table.out.splitlines()[:2]
    assert header.split()[:5] == ["ID", "MACHINE", "WORKLOAD", "NODES", "STATE"]
    assert line.split()[:5] == ["1", "local", "dist_check", "1", "completed"]


@pytest.mark.slow
def test_failing_program_ends_failed_and_submit_follow_returns_its_code(cli, isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "exit3", "import sys\nsys.exit(3)\n")
    result = cli("submit", "local", "exit3", "--follow")
    # The local profile's launcher (mmm_orch.injob.ranks) ends with the worker's own code and
    # says so in one line, not torchrun's exit 1 and failure table. (Both ranks exit 3: either
    # may be the first the launcher sees.)
    assert result.code == 3, result.err
    assert "job 1 failed (exit 3)" in result.err
    assert re.search(r"^ranks: rank [01] exited with code 3 first: exit 3$", result.out, re.M), \
        result.out
    assert "Traceback" not in result.out and "exit_code=3" in result.out
    row = json.loads(cli("status", "1", "--json").out)[0]
    assert (row["state"], row["exit_code"]) == ("failed", 3)


@pytest.mark.slow
def test_cancel_stops_the_whole_process_tree(cli, isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "sleeper", "import os, pathlib, time\n"
                "pathlib.Path(f'pid-{os.environ[\"RANK\"]}').write_text(str(os.getpid()))\n"
                "time.sleep(600)\n")
    assert cli("submit", "local", "sleeper").code == 0
    wait_running(cli, 1, isolated / "pid-1")
    time.sleep(0.5)
    ranks = [int((isolated / f"pid-{r}").read_text()) for r in (0, 1)]
    assert all(psutil.pid_exists(p) for p in ranks)
    asked = time.monotonic()
    result = cli("cancel", "1")
    assert result.code == 0 and "state cancelled" in result.out, result.out + result.err
    # The ranks end at the first SIGTERM: the cancel does not wait out the grace time, though the
    # supervisor it signalled stays a zombie until this process (its parent) reaps it.
    assert time.monotonic() - asked < GRACE_S
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in ranks if psutil.pid_exists(p)], 15)
    assert not alive
    row = json.loads(cli("status", "1", "--json").out)[0]
    assert row["state"] == "cancelled" and row["exit_code"] is None
    assert "already cancelled" in cli("cancel", "1").out
    # How the job script itself ended: its SIGTERM trap's code, not one made up for a process
    # reaped by someone else.
    ended = json.loads((Path(row["job_dir"]) / RESULT_FILE).read_text())
    assert (ended["exit_code"], ended["cancelled"]) == (EXIT_STOPPED_BY_TERM, True), ended


@pytest.mark.slow
def test_a_job_submitted_from_a_process_that_lives_on_is_cancelled_at_once(cli, isolated):
    """A notebook (the Python API) submits a local job and goes on without reaping its ended
    supervisor, which stays a zombie: cancel does not wait on it."""
    (isolated / "marker").unlink(missing_ok=True)
    notebook = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, mmm_orch\n"
         "job = mmm_orch.submit('local', command=[sys.executable, '-c', "
         "'import pathlib, time; pathlib.Path(\"marker\").touch(); time.sleep(600)'])\n"
         "print(job.id, flush=True)\n"
         "time.sleep(120)\n"],
        cwd=isolated, stdout=subprocess.PIPE, text=True)
    try:
        assert notebook.stdout.readline().strip() == "1"
        wait_running(cli, 1, isolated / "marker")
        asked = time.monotonic()
        result = cli("cancel", "1")
        assert result.code == 0 and "state cancelled" in result.out, result.out + result.err
        assert time.monotonic() - asked < GRACE_S
    finally:
        notebook.kill()
        notebook.wait()


@pytest.mark.slow
def test_walltime_is_enforced_locally(cli, isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "slow", "import time\ntime.sleep(600)\n")
    assert cli("submit", "local", "slow", "--walltime", "00:00:08").code == 0
    row = wait_terminal(cli, 1, timeout=60)
    assert row["state"] == "timeout"
    assert "walltime of 8s exceeded" in cli("logs", "1").out


def test_logs_strip_ansi_and_tolerate_bad_bytes(cli, isolated):
    db = JobDB(db_path())
    log = isolated / "job.log"
    log.write_bytes(b"\x1b[31mred\x1b[0m line\nbad \xff\xfe bytes\n" + b"".join(
        f"line {i}\n".encode() for i in range(50)))
    job = db.insert(machine="local", host="h", scheduler="local", commands={}, workload="w",
                    name="w", nodes=1, ranks=1, native_id="1", job_dir=str(isolated),
                    script_path="s", script="", plan={}, submit_dir=str(isolated),
                    git_commit=None, log_path=str(log), submitted_at=time.time(),
                    state="completed")
    raw = cli("logs", str(job))
    assert "\x1b[31mred" in raw.out and "bad \ufffd\ufffd bytes" in raw.out
    stripped = cli("logs", str(job), "--strip-ansi")
    assert stripped.out.startswith("red line\n")
    tail = cli("logs", str(job), "--tail", "2")
    assert tail.out == "line 48\nline 49\n"
    # A terminal job is not followed forever.
    followed = cli("logs", str(job), "--follow", "--tail", "1")
    assert followed.code == 0 and followed.out == "line 49\n"


@pytest.mark.slow
def test_logs_follow_waits_for_a_file_that_does_not_exist_yet(tmp_path):
    import threading

    from mmm_orch.progress import logs

    path = tmp_path / "later.log"
    done = threading.Event()

    def writer():
        time.sleep(0.6)
        with open(path, "wb") as f:
            f.write(b"first\n")
            f.flush()
            time.sleep(0.4)
            f.write(b"second\npartial")
        done.set()

    waits = []
    threading.Thread(target=writer).start()
    chunks = list(logs.follow(LocalHost(), str(path), done.is_set, poll=0.05, done_every=0.1,
                              on_wait=lambda: waits.append(1)))
    assert waits == [1]
    assert b"".join(chunks) == b"first\nsecond\npartial"


def test_unknown_job_is_a_one_line_error(cli):
    for args in (("logs", "7"), ("show", "7"), ("cancel", "7"), ("status", "7")):
        result = cli(*args)
        assert result.code == 2 and "job 7 not found" in result.err, args
        assert len(result.err.strip().splitlines()) == 1


def test_rejected_plan_leaves_no_database_and_no_directory(cli, isolated):
    result = cli("submit", "local", "fsdp", "--nodes", "3")
    assert result.code == 2
    assert not (Path(os.environ["XDG_STATE_HOME"])).exists()


def test_a_failing_scheduler_leaves_no_record_and_no_directory(cli, isolated, tmp_path):
    # A Slurm profile whose sbatch refuses every job in sbatch's words (a silent exit 1 is no
    # refusal: the job may have been taken), then one whose sbatch is missing here and that
    # names no login host to reach it through.
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    refuses = tmp_path / "refuses"
    refuses.write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid "
                       "account or account/partition combination specified' >&2\nexit 1\n")
    refuses.chmod(0o755)
    (machines / "refuses.yaml").write_text(
        f"extends: slurm-local\nname: refuses\nscheduler: {{commands: {{submit: {refuses}}}}}\n")
    (machines / "nosbatch.yaml").write_text(
        "extends: slurm-local\nname: nosbatch\n"
        "scheduler: {commands: {submit: /nonexistent/sbatch}}\n")
    result = cli("submit", "refuses", "dist_check")
    assert result.code == 2, result.err
    assert result.err.startswith(f"mmm-orch: error: {refuses}: sbatch: error: "), result.err
    assert_nothing_recorded()
    result = cli("submit", "nosbatch", "dist_check")
    assert result.code == 2 and "/nonexistent/sbatch is not on PATH here" in result.err
    assert "give --host HOST" in result.err and len(result.err.splitlines()) == 1
    assert_nothing_recorded()


@pytest.mark.slow
def test_concurrent_writers_never_lose_a_record(tmp_path):
    import multiprocessing

    path = tmp_path / "db" / "jobs.db"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_insert_many, args=(path, w, 25)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT native_id FROM jobs").fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert len(rows) == 200 and len({r[0] for r in rows}) == 200


def _insert_many(path: Path, worker: int, count: int) -> None:
    db = JobDB(path)
    for i in range(count):
        db.insert(machine="m", host="h", scheduler="slurm", commands={}, workload="w", name="w",
                  nodes=1, ranks=1, native_id=f"{worker}-{i}", job_dir="d", script_path="s",
                  script="#!/bin/bash\n", plan={"i": i}, submit_dir="/", git_commit=None,
                  log_path="l", submitted_at=time.time())


def test_without_the_scheduler_here_submit_goes_to_the_login_host(cli, isolated, monkeypatch):
    # Without qsub on PATH (the PBS test server's is left out), submit heads for aurora's login
    # host; here that host refuses connections: exit 3 (unreachable), one line, nothing recorded.
    monkeypatch.setenv("PATH", os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "qsub").exists()))
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "aurora.yaml").write_text("extends: aurora\nlogin_hosts: [login]\n")
    ssh = Path(os.environ["HOME"]) / ".ssh"
    ssh.mkdir(parents=True)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again once the block ends
    (ssh / "config").write_text(f"Host login\n  HostName 127.0.0.1\n  Port {port}\n")
    result = cli("submit", "aurora", "fsdp", "-A", "PROJ")
    assert result.code == 3, result.err
    assert result.err.startswith(f"mmm-orch: error: ssh login: cannot reach 127.0.0.1:{port}")
    assert len(result.err.splitlines()) == 1
    assert not Path(os.environ["XDG_STATE_HOME"]).exists()


@pytest.mark.slow
def test_elapsed_is_the_jobs_own_not_when_status_looked(cli, isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "nap", "import time\ntime.sleep(4)\n")
    submitted = time.time()
    assert cli("submit", "local", "nap").code == 0
    result = Path(JobDB(db_path()).get(1).job_dir) / "result.json"
    deadline = time.monotonic() + 120
    while not result.exists():  # no status call until the job has ended
        assert time.monotonic() < deadline
        time.sleep(0.2)
    seen_ended = time.time()
    time.sleep(3)
    row = wait_terminal(cli, 1)
    assert row["state"] == "completed"
    # Within the job's own life, however long a loaded host takes to start it: not from the
    # submission, and not up to when status looked.
    assert submitted <= row["started_at"] and row["ended_at"] <= seen_ended, (submitted, row)
    assert row["ended_at"] - row["started_at"] >= 4, row


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()
            if '"event": "step"' in line]


def _wait_steps(path: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and len(_steps(path)) >= count):
        assert time.monotonic() < deadline, f"fewer than {count} steps in {path}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cancel", "walltime"])
def test_local_cancel_and_walltime_checkpoint_then_rerun_continues(cli, isolated, how):
    """The supervisor stops the job as a scheduler does and waits for every process, so rank 0
    finishes its checkpoint; its rerun (by default after either end: `cancelled` and `walltime`
    both resume) continues at the next step, not at step 1, in the same run directory. Its steps
    are paced (they wait, not compute, until the stop): two minutes leave a loaded host's start
    room before the walltime stop."""
    write_spec(isolated, "llama_chain", PACED_SPEC)
    args = ["submit", "local", "llama_chain", "--set", "steps=100000",
            "--json"] + (["--walltime", "00:02:00"] if how == "walltime" else [])
    first = json.loads(cli(*args).out)
    record = open_db(None).get(first["id"])
    metrics = Path(record.run_dir) / "metrics.jsonl"
    _wait_steps(metrics, 3, timeout=240)
    if how == "cancel":
        assert cli("cancel", str(first["id"])).code == 0
    row = wait_state(cli, first["id"], ("cancelled", "timeout"), timeout=300)
    assert row["state"] == ("cancelled" if how == "cancel" else "timeout")
    assert row["end_class"] == ("cancelled" if how == "cancel" else "walltime")
    saved = [json.loads(line) for line in metrics.read_text().splitlines()
             if '"event": "checkpoint"' in line]
    assert saved and saved[-1]["reason"] == "signal", metrics.read_text()[-2000:]
    last = _steps(metrics)[-1]
    assert saved[-1]["step"] == last
    again = cli("rerun", str(first["id"]), "--json")
    assert again.code == 0, again.err
    new = json.loads(again.out)
    assert new["rerun_of"] == first["id"] and new["run_dir"] == record.run_dir
    _wait_steps(metrics, last + 3, timeout=240)
    assert cli("cancel", str(new["id"])).code == 0
    wait_state(cli, new["id"], ("cancelled",), timeout=120)
    steps = _steps(metrics)
    assert steps[:last] == list(range(1, last + 1))
    assert steps[last:last + 3] == [last + 1, last + 2, last + 3]  # from the checkpoint on


@pytest.mark.slow
def test_resume_without_a_checkpoint_fails_and_says_so_unless_fresh_is_allowed(cli, isolated):
    result = cli("submit", "local", "llama3_debug", "--set", "tiny=true", "--set", "steps=3",
                 "--set", "run_name=nothing-here", "--set", "resume=true", "--follow")
    assert result.code != 0
    log = cli("logs", "1").out
    assert "[runtime] error: --resume: no checkpoint in outputs/nothing-here/checkpoints" in log
    diagnosis = json.loads(cli("diagnose", "1", "--json").out)["first"]
    assert diagnosis["signature"] == "trainer-refused"
    fresh = cli("submit", "local", "llama3_debug", "--set", "tiny=true", "--set", "steps=3",
                "--set", "run_name=nothing-here", "--set", "resume=true",
                "--set", "allow_fresh=true", "--follow")
    assert fresh.code == 0, fresh.err


@pytest.mark.slow
def test_concurrent_local_runs_never_share_a_run_directory(cli, isolated):
    ids = [json.loads(cli("submit", "local", "llama3_debug", "--set", "tiny=true", "--set",
                          "steps=10", "--json").out)["id"] for _ in range(2)]
    rows = [wait_state(cli, i, ("completed", "failed"), timeout=180) for i in ids]
    assert [r["state"] for r in rows] == ["completed", "completed"]
    dirs = [open_db(None).get(i).run_dir for i in ids]
    assert dirs[0] != dirs[1]
    for run in dirs:
        assert _steps(Path(run) / "metrics.jsonl") == list(range(1, 11))  # each its own, whole
    # Naming the same run twice at once: the second refuses instead of interleaving. (Paced
    # steps: the first holds the run for 30 s or more on any host, waiting rather than computing.)
    write_spec(isolated, "llama_chain", PACED_SPEC)
    same = [json.loads(cli("submit", "local", "llama_chain", "--set", "steps=60", "--set",
                           "run_name=shared", "--json").out)["id"]
            for _ in range(2)]
    rows = [wait_state(cli, i, ("completed", "failed"), timeout=300) for i in same]
    assert sorted(r["state"] for r in rows) == ["completed", "failed"]
    refused = next(i for i, r in zip(same, rows) if r["state"] == "failed")
    assert "is in use by another run" in cli("logs", str(refused)).out


def test_a_local_job_on_another_computer_is_not_taken_for_vanished(tmp_path):
    """A `launch` or packed point runs under its supervisor on a compute node; `status` on the
    login node shares its directory but not its processes: the job stays as last known until
    its result file says how it ended, and a cancel says where to send it."""
    from mmm_orch.errors import SchedulerError
    from mmm_orch.injob.protocol import RESULT_FILE, SUPERVISOR_FILE
    from mmm_orch.schedulers.base import JobRef
    from mmm_orch.schedulers.local.scheduler import LocalScheduler
    from mmm_orch.schedulers.states import JobState

    (tmp_path / SUPERVISOR_FILE).write_text(json.dumps(
        {"pid": 1, "create_time": time.time() - 60, "host": "x1000c0s0b0n0"}))
    job = JobRef("1", tmp_path)
    seen = LocalScheduler().query([job])["1"]
    assert seen.state is JobState.UNKNOWN and "runs on x1000c0s0b0n0" in seen.reason
    with pytest.raises(SchedulerError, match="runs on x1000c0s0b0n0: cancel it there"):
        LocalScheduler().cancel(job)
    (tmp_path / RESULT_FILE).write_text(json.dumps(
        {"exit_code": 0, "signal": None, "cancelled": False, "timed_out": False,
         "ended_at": time.time()}))
    assert LocalScheduler().query([job])["1"].state is JobState.COMPLETED


def test_a_local_job_whose_supervisor_ended_unrecorded_after_a_cancel_is_cancelled(tmp_path):
    """A supervisor the cancel had to kill (still stopping the job past its grace) ends without
    its result, which the cancel writes only once the rest of the job is gone: a look meanwhile
    (the sweep's runner) takes the job for cancelled, as the cancel said before it signalled,
    and never for vanished."""
    from mmm_orch.injob.protocol import CANCEL_SENT_FILE, SUPERVISOR_FILE
    from mmm_orch.schedulers.base import JobRef
    from mmm_orch.schedulers.local.scheduler import LocalScheduler
    from mmm_orch.schedulers.states import JobState

    gone = {"pid": os.getpid(), "create_time": psutil.Process().create_time() - 60}  # not this one
    (tmp_path / SUPERVISOR_FILE).write_text(json.dumps(gone))
    job = JobRef("1", tmp_path)
    assert LocalScheduler().query([job])["1"].native_state == "vanished"
    (tmp_path / CANCEL_SENT_FILE).touch()
    seen = LocalScheduler().query([job])["1"]
    assert (seen.state, seen.exit_code) == (JobState.CANCELLED, None)
