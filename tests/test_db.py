"""The job database as users break it: a directory or a foreign file given as --db, a read-only
place, a full disk (real tmpfs mounts), a file truncated to nothing, a damaged file. Each is
refused before anything is submitted, with one line that says what to do; a truncated or damaged
database is recovered from its backup and the jobs' own records, never overwritten."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from helpers.profiles import write_probe
from mmm_orch.records.db import JobDB
from mmm_orch.records.dbfile import SCHEMA_VERSION, backup_path

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs mounts need root (CI runs as root)")


@pytest.fixture
def noop(isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "noop", "pass\n")
    return "noop"


def nothing_submitted(isolated: Path) -> None:
    """No local job ran: no supervisor, no job directory anywhere under the test's tree."""
    assert not list(isolated.parent.rglob("supervisor.json"))
    assert not list(isolated.parent.rglob("job.sh"))


def one_error(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err and "internal error" not in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_a_directory_as_the_database(cli, isolated, noop, tmp_path):
    (tmp_path / "adir").mkdir()
    one_error(cli("--db", str(tmp_path / "adir"), "submit", "local", noop), "is a directory")
    one_error(cli("--db", str(tmp_path / "adir"), "status"), "is a directory")
    nothing_submitted(isolated)


def test_a_file_that_is_not_sqlite(cli, isolated, noop, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my precious notes\n")
    one_error(cli("--db", str(notes), "submit", "local", noop), "not an SQLite database")
    one_error(cli("--db", str(notes), "status"), "not an SQLite database")
    assert notes.read_text() == "my precious notes\n"
    nothing_submitted(isolated)


def test_a_path_under_a_file(cli, isolated, noop, tmp_path):
    (tmp_path / "plain").write_text("x")
    one_error(cli("--db", str(tmp_path / "plain" / "jobs.db"), "submit", "local", noop),
              "is a file, not a directory")
    nothing_submitted(isolated)


@needs_root
def test_a_read_only_place(cli, isolated, noop, tmpfs):
    ro = tmpfs("ro", "ro,size=1m")
    one_error(cli("--db", str(ro / "jobs.db"), "submit", "local", noop), "cannot", "read-only")
    nothing_submitted(isolated)


@needs_root
def test_a_full_disk(cli, isolated, noop, tmpfs, monkeypatch):
    full = tmpfs("full", "size=256k")
    monkeypatch.setenv("XDG_STATE_HOME", str(full))
    subprocess.run(["dd", "if=/dev/zero", f"of={full / 'filler'}", "bs=4k"], capture_output=True)
    result = cli("submit", "local", noop)
    one_error(result, "disk is full")
    nothing_submitted(isolated)
    # Room again: the same command works, and the database holds exactly that one job.
    (full / "filler").unlink()
    assert cli("submit", "local", noop).code == 0
    rows = json.loads(cli("status", "--json").out)
    assert [r["id"] for r in rows] == [rows[0]["id"]] and rows[0]["state"] != "submitting"


def test_read_commands_never_create_a_database(cli, tmp_path):
    for argv in (["status"], ["status", "--all", "--json"], ["startup"]):
        assert cli(*argv).code == 0
    assert cli("status", "999").code == 2
    assert not (tmp_path / "state").exists()


def _submit_some(cli, noop: str, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        result = cli("submit", "local", noop, "--json")
        assert result.code == 0, result.err
        ids.append(json.loads(result.out)["id"])
    return ids


def db_file() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"


@pytest.mark.slow
def test_truncated_database_is_refused_then_recovered(cli, isolated, noop):
    ids = _submit_some(cli, noop, 3)
    before = {r["id"]: r["job_dir"] for r in json.loads(cli("status", "--all", "--json").out)}
    assert backup_path(db_file()).exists()  # written with the first submission
    db_file().write_bytes(b"")  # what a crashed editor or `> jobs.db` leaves
    for argv in (["status"], ["submit", "local", noop]):
        one_error(cli(*argv), "is empty (0 bytes)", "truncated", "mmm-orch db recover")
    assert db_file().stat().st_size == 0  # refused, not overwritten
    check = cli("db", "check")
    assert "NEEDS RECOVERY" in check.out
    recovered = cli("db", "recover")
    assert recovered.code == 0, recovered.err
    assert "recovered 3 jobs" in recovered.out
    after = {r["id"]: r["job_dir"] for r in json.loads(cli("status", "--all", "--json").out)}
    assert after == before
    kept = [p for p in db_file().parent.iterdir() if ".damaged-" in p.name]
    assert kept and kept[0].stat().st_size == 0
    new = json.loads(cli("submit", "local", noop, "--json").out)["id"]
    assert new == max(ids) + 1  # ids continue, none reused
    assert "healthy" in cli("db", "check").out


@pytest.mark.slow
def test_damaged_database_is_refused_then_recovered(cli, isolated, noop):
    _submit_some(cli, noop, 4)
    before = {r["id"]: r["job_dir"] for r in json.loads(cli("status", "--all", "--json").out)}
    with sqlite3.connect(db_file()) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = db_file().stat().st_size
    with open(db_file(), "r+b") as handle:  # scribble over every page but the first
        handle.seek(4096)
        handle.write(os.urandom(size - 4096))
    result = cli("status", "--all")
    one_error(result, "damaged", "mmm-orch db recover")
    assert "NEEDS RECOVERY" in cli("db", "check").out
    recovered = cli("db", "recover")
    assert recovered.code == 0, recovered.err
    after = {r["id"]: r["job_dir"] for r in json.loads(cli("status", "--all", "--json").out)}
    assert after == before


def test_an_older_database_is_upgraded_in_place(tmp_path):
    old = tmp_path / "jobs.db"
    with sqlite3.connect(old) as conn:  # the schema of mmm-orch 0.1.0 as it first shipped
        conn.executescript("""
            CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, machine TEXT NOT NULL,
              host TEXT NOT NULL, scheduler TEXT NOT NULL, commands TEXT NOT NULL,
              workload TEXT NOT NULL, name TEXT NOT NULL, nodes INTEGER NOT NULL,
              ranks INTEGER NOT NULL, native_id TEXT NOT NULL, job_dir TEXT NOT NULL,
              script_path TEXT NOT NULL, script TEXT NOT NULL, plan TEXT NOT NULL,
              submit_dir TEXT NOT NULL, git_commit TEXT, log_path TEXT NOT NULL,
              state TEXT NOT NULL, native_state TEXT NOT NULL DEFAULT '',
              reason TEXT NOT NULL DEFAULT '', exit_code INTEGER, signal INTEGER,
              submitted_at REAL NOT NULL, started_at REAL, ended_at REAL, checked_at REAL NOT NULL);
            CREATE TABLE events (job_id INTEGER NOT NULL REFERENCES jobs(id), at REAL NOT NULL,
              state TEXT NOT NULL, native_state TEXT NOT NULL, reason TEXT NOT NULL);
            INSERT INTO jobs VALUES (1, 'local', 'h', 'local', '{}', 'fsdp', 'fsdp', 1, 2, '42',
              '/j', '/j/job.sh', '#!/bin/bash', '{}', '/', NULL, '/j/job.log', 'completed', '',
              '', 0, NULL, 1.0, 2.0, 3.0, 4.0);
            PRAGMA user_version = 1;
        """)
    db = JobDB(old)
    record = db.get(1)
    assert record.native_id == "42" and record.state.value == "completed"
    assert record.remote == "" and record.tag == "" and record.group_id is None
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
