"""Jobs as the tests wait for and check them: the states that end a job, a poll of its status
that does not count the time it queued on a shared test scheduler, a job sent past its
walltime, the jobs a failed test left on a scheduler, and nothing recorded after a refusal."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from helpers.cli import run_cli
from helpers.profiles import write_probe
from helpers.schedulers import PBS_BIN

TERMINAL = ("completed", "failed", "cancelled", "timeout", "hung")


# The shared test schedulers run several tests' jobs side by side, so a job may queue for minutes
# behind the others: time spent queued counts against QUEUE_LIMIT, not against a wait's timeout.
QUEUE_LIMIT = 900
QUEUED = ("submitting", "pending")


def poll_row(read_row, done, timeout: float, interval: float) -> dict:
    """Poll `read_row()` until `done(row)`; returns the last row. Raises TimeoutError once the
    job spent `timeout` seconds out of the queue, or QUEUE_LIMIT seconds in it."""
    started = last = time.monotonic()
    queued = 0.0
    while True:
        row = read_row()
        now = time.monotonic()
        if row["state"] in QUEUED:
            queued += now - last
        last = now
        if done(row):
            return row
        if now - started - queued > timeout or queued > QUEUE_LIMIT:
            raise TimeoutError(f"job {row.get('id')} still {row['state']} after {now - started:.0f}s "
                               f"({queued:.0f}s of it queued): {row}")
        time.sleep(interval)


def wait_state(cli, job: int, states: tuple[str, ...] = TERMINAL, timeout: float = 300) -> dict:
    """The job's status row once its state is one of `states` (polling `mmm-orch status`)."""
    def read_row() -> dict:
        result = cli("status", str(job), "--json")
        assert result.code == 0, result.err
        return json.loads(result.out)[0]
    return poll_row(read_row, lambda row: row["state"] in states, timeout, interval=1)


def cancel_leftovers() -> None:
    """Cancel the jobs a test left queued or running on a shared test scheduler, so that a failed
    test does not hold nodes the next ones wait for."""
    import sqlite3

    path = Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"
    if not path.exists():
        return
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT scheduler, native_id FROM jobs WHERE state IN "
                            "('submitting', 'pending', 'running', 'unknown') AND native_id != ''"
                            ).fetchall()
    for kind, native_id in rows:
        command = {"slurm": "scancel", "pbs": f"{PBS_BIN}/qdel"}.get(kind)
        if command:
            subprocess.run([command, native_id], capture_output=True, timeout=30)


def submit_over_walltime(machine: str, root: Path) -> Path:
    """Submit, with its own database in `root`, a one-node job that sleeps past its 1-minute
    walltime; returns the database (see wait_in_db)."""
    write_probe(root, "forever", "import time\ntime.sleep(900)\n")
    db = root / "jobs.db"
    proc = run_cli("--db", str(db), "submit", machine, "forever", "--walltime", "00:01:00",
                   cwd=root, env={"PYTHONPATH": str(root), "MMM_ORCH_PATH": str(root / ".mmm-orch"),
                                  "HOME": str(root / "home")})
    assert proc.returncode == 0, proc.stderr
    return db


def wait_in_db(db: Path, job: int, timeout: float) -> dict:
    """The job's status row from the database `db` once it ended, or as it is at the timeout."""
    def read_row() -> dict:
        return json.loads(run_cli("--db", str(db), "status", str(job), "--json").stdout)[0]
    try:
        return poll_row(read_row, lambda row: row["state"] in TERMINAL, timeout, interval=2)
    except TimeoutError:
        return read_row()


def assert_nothing_recorded() -> None:
    """After a submission the scheduler refused: no record and no job directory. (The database
    itself may exist: the record is written before the scheduler is asked, then removed.)"""
    import sqlite3

    state = Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch"
    if (state / "jobs.db").exists():
        with sqlite3.connect(state / "jobs.db") as conn:
            assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0
            assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
    jobs = state / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir()), list(jobs.iterdir())
