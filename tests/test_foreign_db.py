"""Someone else's file as the job database, and a job database replaced under mmm-orch.

Every kind of file that is not an mmm-orch database, given as --db, is refused by every command
that opens the database (found by walking the CLI's parser): exit 2, one line, the file
byte-identical with the same mtime, nothing created beside it. A database replaced while jobs
ran (by an empty mmm-orch database, a foreign file, an older copy, or removed) is noticed by
every command from the jobs' own directories, and `db recover` brings every job back."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from helpers.jobs import wait_state
from helpers.profiles import write_probe
from mmm_orch.cli import build_parser
from mmm_orch.injob.protocol import RECORD_FILE
from mmm_orch.records.db import JobDB, close_all, open_db
from mmm_orch.records.dbfile import (APPLICATION_ID, SCHEMA_VERSION, DatabaseError, backup_path,
                                  jobs_root_for, mark_path)

# Commands that never open the job database (`db` alone only names its actions).
NO_DB = {"machines", "workloads", "schema", "env", "env create", "env check", "db", "balance"}
# Every command that opens it, as run here (job 1, machine `local`, workload dist_check).
OPENS = {
    "show": ["show", "1"],
    "render": ["render", "local", "dist_check"],
    "submit": ["submit", "local", "dist_check", "--dry-run"],
    "submit (real)": ["submit", "local", "dist_check", "--no-env-check"],
    "launch": ["launch", "local", "dist_check", "--dry-run"],
    "launch (real)": ["launch", "local", "dist_check", "--no-env-check"],
    "rerun": ["rerun", "1"],
    "status": ["status"],
    "status (job)": ["status", "1", "--all", "--json"],
    "logs": ["logs", "1"],
    "cancel": ["cancel", "1"],
    "backlog": ["backlog"],
    "submit (backlog)": ["submit", "local", "dist_check", "--no-env-check", "--backlog"],
    "sweep": ["sweep", "local", "dist_check", "-N", "1", "--dry-run"],
    "sweep (real)": ["sweep", "local", "dist_check", "-N", "1", "--no-env-check"],
    "pack-run": ["pack-run", "1"],
    "allocate": ["allocate", "local", "--dry-run"],
    "allocate (real)": ["allocate", "local", "--no-env-check"],
    "submit (into)": ["submit", "local", "dist_check", "--into", "1", "--no-env-check"],
    "hold": ["hold", "1"],
    "report": ["report", "1"],
    "plot": ["plot", "1"],
    "export": ["export", "1", "--to", "hf", "exported"],
    "profile": ["profile", "1"],
    "diagnose": ["diagnose", "1"],
    "timeline": ["timeline", "1"],
    "startup": ["startup"],
    "nodes": ["nodes"],
    "usage": ["usage"],
    "nodes forget": ["nodes", "forget", "n1"],
    "db check": ["db", "check"],
    "db backup": ["db", "backup"],
    "db recover": ["db", "recover"],
}


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= {prefix + name} | commands(sub, prefix + name + " ")
    return found


def test_every_command_is_covered():
    # A new command must say here whether it opens the database.
    assert commands(build_parser()) == NO_DB | {name.split(" (")[0] for name in OPENS}


def _sqlite(path: Path, script: str, wal: bool = False) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(script)
    conn.close()


def _mmm_orch_db(path: Path) -> None:
    JobDB(path).close()


def _newer(path: Path) -> None:
    _mmm_orch_db(path)
    _sqlite(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")


def _old_shape_newer(path: Path) -> None:
    """mmm-orch's tables, no mark (as an earlier version made them), an unknown version."""
    _mmm_orch_db(path)
    _sqlite(path, f"PRAGMA application_id = 0; PRAGMA user_version = {SCHEMA_VERSION + 1}")


def _other_application(path: Path) -> None:
    _mmm_orch_db(path)  # even with mmm-orch's tables: another program's mark
    _sqlite(path, "PRAGMA application_id = 1234567")


def _our_tables_and_more(path: Path) -> None:
    _mmm_orch_db(path)
    _sqlite(path, "PRAGMA application_id = 0; CREATE TABLE users (name TEXT)")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


FOREIGN = {
    "text file": lambda p: p.write_text("my precious notes\n"),
    "empty file": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(b"\x00garbage" + os.urandom(8184)),
    "directory": lambda p: p.mkdir(),
    "fifo": _fifo,
    "sqlite, other tables": lambda p: _sqlite(p, "CREATE TABLE users (name TEXT);"
                                                 "INSERT INTO users VALUES ('ada');"),
    "sqlite in WAL mode": lambda p: _sqlite(p, "CREATE TABLE t (x); INSERT INTO t VALUES (1);",
                                            wal=True),
    "sqlite, no tables": lambda p: _sqlite(p, "PRAGMA user_version = 7"),
    "sqlite, lookalike jobs table": lambda p: _sqlite(
        p, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, name TEXT);"
           "CREATE TABLE events (job_id INTEGER);"),
    "sqlite, another application id": _other_application,
    "sqlite, mmm-orch tables and more": _our_tables_and_more,
    "mmm-orch db, newer schema": _newer,
    "mmm-orch tables, unmarked, newer schema": _old_shape_newer,
}


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under `directory`: kind, size, mtime and bytes (files)."""
    seen = {}
    for path in sorted(directory.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_fifo() else None
        seen[str(path.relative_to(directory))] = (st.st_mode, st.st_size, st.st_mtime_ns, data)
    return seen


def one_line_error(result, *fragments: str) -> str:
    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), result.err
    assert "internal error" not in lines[0] and "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("command", sorted(OPENS))
@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_a_foreign_file_is_refused_and_left_alone(cli, tmp_path, kind, command):
    where = tmp_path / "theirs"
    where.mkdir()
    target = where / "data.db"
    FOREIGN[kind](target)
    close_all()
    time.sleep(0.01)  # a write by mmm-orch would move the mtime visibly
    before = snapshot(where)
    where_mtime = where.stat().st_mtime_ns
    line = one_line_error(cli("--db", str(target), *OPENS[command]), str(target))
    if "newer" in kind:
        assert "newer mmm-orch" in line
    else:
        assert "not an mmm-orch job database" in line and "--db and $MMM_ORCH_DB must name" in line
    assert snapshot(where) == before and where.stat().st_mtime_ns == where_mtime
    assert not (tmp_path / "state").exists()  # nothing made in the default place either
    assert not list(tmp_path.rglob("job.sh"))


def test_the_environment_variable_is_checked_the_same(cli, tmp_path, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("not yours\n")
    monkeypatch.setenv("MMM_ORCH_DB", str(notes))
    one_line_error(cli("status"), str(notes), "not an SQLite database")
    assert notes.read_text() == "not yours\n"


def test_an_mmm_orch_database_is_created_marked_and_whole(cli, tmp_path):
    # Only a path with nothing there is created, by a command that writes, in one step: a
    # database there is always complete and marked (an empty file is never one of ours).
    path = tmp_path / "new" / "jobs.db"
    assert open_db(str(path)) is None and not path.parent.exists()
    db = open_db(str(path), create=True)
    close_all()
    with open(path, "rb") as handle:
        head = handle.read(100)
    assert int.from_bytes(head[68:72], "big") == APPLICATION_ID
    assert int.from_bytes(head[60:64], "big") == SCHEMA_VERSION
    assert sorted(p.name for p in path.parent.iterdir()) == ["jobs.db"]
    assert db is not None and cli("--db", str(path), "db", "check").code == 0


def test_a_database_of_an_earlier_version_is_recognised_and_marked(cli, tmp_path):
    path = tmp_path / "jobs.db"
    _mmm_orch_db(path)
    _sqlite(path, "PRAGMA application_id = 0; PRAGMA user_version = 3")  # as 0.x left it
    assert cli("--db", str(path), "status").code == 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("content", [b"", b"\x13\x37garbage" * 100], ids=["empty", "garbage"])
def test_db_check_refuses_what_is_not_a_database(cli, tmp_path, content):
    path = tmp_path / "jobs.db"
    path.write_bytes(content)
    one_line_error(cli("--db", str(path), "db", "check"), str(path), "not an mmm-orch job database")
    assert path.read_bytes() == content


# -- a database replaced under running jobs ---------------------------------------------------

@pytest.fixture
def noop(isolated, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(isolated))
    write_probe(isolated, "noop", "pass\n")
    return "noop"


def db_file() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch" / "jobs.db"


def _submitted(cli, noop: str, count: int) -> dict[int, str]:
    for _ in range(count):
        result = cli("submit", "local", noop, "--json")
        assert result.code == 0, result.err
        wait_state(cli, json.loads(result.out)["id"], ("completed",), timeout=120)
    return {r["id"]: r["job_dir"] for r in json.loads(cli("status", "--all", "--json").out)}


def _replace_with_empty_mmm_orch_db(path: Path) -> None:
    other = path.with_name("other.db")
    _mmm_orch_db(other)
    other.replace(path)


def _replace_with_foreign_sqlite(path: Path) -> None:
    other = path.with_name("other.db")
    _sqlite(other, "CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ada');")
    other.replace(path)


def _restore_the_backup(path: Path) -> None:
    shutil.copy(backup_path(path), path)  # written with job 1 only (refreshed every 10 min)


REPLACEMENTS = {
    "an empty mmm-orch database": (_replace_with_empty_mmm_orch_db, 3, "replaced or rolled back"),
    "a foreign SQLite file": (_replace_with_foreign_sqlite, 3, "not an mmm-orch job database"),
    "an older copy": (_restore_the_backup, 2, "replaced or rolled back"),
    "nothing (removed)": (Path.unlink, 3, "is missing"),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(REPLACEMENTS))
def test_a_replaced_database_is_noticed_then_recovered(cli, isolated, noop, how):
    replace, lost, says = REPLACEMENTS[how]
    before = _submitted(cli, noop, 3)
    assert sorted(before) == [1, 2, 3]
    close_all()
    replace(db_file())
    state = db_file().parent
    files = snapshot(state)
    for name, argv in OPENS.items():
        if name in ("db check", "db recover"):
            continue
        result = cli(*argv)
        one_line_error(result, str(db_file()), says, f"{lost} ", "mmm-orch db recover")
        assert snapshot(state) == files, name  # nothing written, no job submitted
    check = cli("db", "check")
    assert check.code == 2 and "NEEDS RECOVERY" in check.out, check
    assert snapshot(state) == files
    recovered = cli("db", "recover")
    assert recovered.code == 0, recovered.err
    after = {r["id"]: r["job_dir"] for r in json.loads(cli("status", "--all", "--json").out)}
    assert after == before
    kept = [p for p in state.iterdir() if ".damaged-" in p.name]
    assert len(kept) == (0 if how.startswith("nothing") else 1)
    assert cli("db", "check").code == 0
    assert json.loads(cli("submit", "local", noop, "--json").out)["id"] == 4  # ids go on


@pytest.mark.slow
def test_a_refused_submission_id_is_not_reused_after_recovery(cli, isolated, noop):
    _submitted(cli, noop, 2)
    db = open_db(None)
    gone = db.insert(machine="local", host="h", scheduler="local", commands={}, workload="w",
                     name="w", nodes=1, ranks=1, native_id="", job_dir="/nowhere",
                     script_path="s", script="", plan={}, submit_dir="/", git_commit=None,
                     log_path="l", submitted_at=time.time())
    db.delete(gone)  # as a submission the scheduler refused: its id stays used
    close_all()
    _replace_with_empty_mmm_orch_db(db_file())
    assert cli("db", "recover").code == 0
    assert json.loads(cli("submit", "local", noop, "--json").out)["id"] == gone + 1


def _fake_jobs(path: Path, count: int) -> None:
    """`count` recorded jobs with their directories, as submit leaves them (no scheduler)."""
    db = JobDB(path)
    root = jobs_root_for(path)
    for i in range(count):
        job_dir = root / f"job-{i:04d}"
        job_dir.mkdir(parents=True)
        values = dict(machine="local", host="h", scheduler="local", commands={}, workload="w",
                      name="w", nodes=1, ranks=1, native_id=str(i), job_dir=str(job_dir),
                      script_path="s", script="#!/bin/bash\n" * 20, plan={"i": i},
                      submit_dir="/", git_commit=None, log_path="l", submitted_at=time.time())
        job_id = db.insert(**values)
        (job_dir / RECORD_FILE).write_text(json.dumps({"id": job_id, **values}))
    db.close()


def test_the_check_lists_no_directories_while_the_database_is_whole(tmp_path, monkeypatch):
    """1000 job directories: opening a whole database reads the mark and one row, nothing more;
    only a database below its mark costs a listing of the directories. Counted, not timed
    (benchmarks time things): every listing goes through job_records."""
    from mmm_orch.records import dbfile as db_module

    listings = []
    real = db_module.job_records
    monkeypatch.setattr(db_module, "job_records",
                        lambda root: listings.append(root) or real(root))
    path = tmp_path / "jobs.db"
    _fake_jobs(path, 1000)
    assert int(mark_path(path).read_text()) == 1000
    for _ in range(3):
        open_db(str(path))
        close_all()
    assert listings == []
    _replace_with_empty_mmm_orch_db(path)
    with pytest.raises(DatabaseError, match="lacks 1000 of the jobs"):
        open_db(str(path))
    assert len(listings) == 1


def test_the_mark_is_overwritten_whole_in_place(tmp_path):
    """The mark is rewritten where it lies (no rename: see write_mark): an earlier version's
    short mark, and a longer text, leave nothing of theirs behind."""
    from mmm_orch.records.dbfile import read_mark, write_mark

    path = tmp_path / "jobs.db"
    mark_path(path).write_text("7\n")  # as mmm-orch wrote it before
    assert read_mark(path) == 7
    write_mark(path, 8)
    assert read_mark(path) == 8
    mark_path(path).write_text("9" * 40 + "\n")
    write_mark(path, 12)
    assert read_mark(path) == 12 and len(mark_path(path).read_text()) == 21
