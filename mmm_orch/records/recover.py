"""Check and rebuild the job database.

`check` says whether the database is whole and whether every job directory has its record.
`recover` builds a new database from everything that still holds records, newest first: the rows
of the damaged file that can still be read, its backup (jobs.db.backup), and each job's own
record.json. The damaged file is kept beside it (jobs.db.damaged-<time>), never deleted. States
of recovered jobs come back from the schedulers at the next `status`.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import RECORD_FILE
from mmm_orch.records.db import JobDB
from mmm_orch.records.dbfile import (
    SQLITE_HEADER,
    backup_path,
    check_file,
    describe,
    earlier_records,
    held_jobs,
    identify,
    job_records,
    jobs_root_for,
    read_mark,
    recorded_job_dirs,
    write_mark,
)
from mmm_orch.schedulers.states import JobState


@dataclass
class Report:
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # job_dir -> row
    events: dict[str, list[tuple]] = field(default_factory=dict)  # job_dir -> events
    sources: dict[str, int] = field(default_factory=dict)  # where rows came from


def _readable_rows(file: Path) -> tuple[list[dict[str, Any]], dict[int, list[tuple]], str]:
    """The rows of `jobs` (and their events) that can still be read from a possibly damaged
    file, one by one; and what went wrong, if anything."""
    if not file.is_file() or file.stat().st_size == 0:
        return [], {}, "missing or empty"
    with open(file, "rb") as handle:
        if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            return [], {}, "not an SQLite database"
    rows: list[dict[str, Any]] = []
    events: dict[int, list[tuple]] = {}
    problem = ""
    try:
        # rw, not ro: a read-only connection to a WAL database leaves -wal and -shm files behind
        conn = sqlite3.connect(f"{file.absolute().as_uri()}?mode=rw", uri=True)
    except sqlite3.Error as exc:
        return [], {}, describe(exc)
    conn.row_factory = sqlite3.Row
    try:
        try:
            top = conn.execute("SELECT MAX(id) FROM jobs").fetchone()[0] or 0
        except sqlite3.Error as exc:
            problem, top = describe(exc), 0
            with contextlib.suppress(sqlite3.Error):
                top = conn.execute(
                    "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'"
                ).fetchone()[0]
        for job_id in range(1, top + 1):
            try:
                row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            except sqlite3.Error as exc:
                problem = problem or describe(exc)
                continue
            if row is not None:
                rows.append(dict(row))
                with contextlib.suppress(sqlite3.Error):
                    events[job_id] = [
                        tuple(e)
                        for e in conn.execute(
                            "SELECT at, state, native_state, reason FROM events WHERE job_id = ?",
                            (job_id,),
                        )
                    ]
    finally:
        conn.close()
    return rows, events, problem


def gather(db_file: Path, read_db: bool = True) -> Report:
    """What the database (unless `read_db` is False: not an mmm-orch file), its backup and the
    job directories still hold."""
    report = Report()
    problems = []
    sources = (("database", db_file),) if read_db else ()
    for label, file in (*sources, ("backup", backup_path(db_file))):
        rows, events, problem = _readable_rows(file)
        if problem and label == "database":
            problems.append(problem)
        for row in rows:
            if row["job_dir"] not in report.rows:
                report.rows[row["job_dir"]] = row
                report.events[row["job_dir"]] = events.get(row["id"], [])
                report.sources[label] = report.sources.get(label, 0) + 1
    for record in job_records(jobs_root_for(db_file)):
        if record.get("job_dir") and record["job_dir"] not in report.rows:
            row = {k: v for k, v in record.items()}
            row["state"] = (
                JobState.PENDING.value if row.get("native_id") else JobState.SUBMITTING.value
            )
            row["commands"] = json.dumps(row["commands"])
            row["plan"] = json.dumps(row["plan"])
            row["checked_at"] = row.get("submitted_at", time.time())
            report.rows[row["job_dir"]] = row
            report.sources["job records"] = report.sources.get("job records", 0) + 1
    return report


def _accept(db_file: Path) -> tuple[str, str]:
    """What is at `db_file` (see identify), if it is one to check or recover: an mmm-orch
    database, nothing, or what took the place of one that recorded jobs. Anything else gets the
    one-line refusal every command gives."""
    kind, what = identify(db_file)
    evidence = {"empty": earlier_records, "foreign": held_jobs}.get(kind)
    if kind == "newer" or (evidence is not None and not evidence(db_file)):
        check_file(db_file)  # raises
    return kind, what


def check(db_file: Path) -> list[str]:
    """Lines that describe the database's health; the first says whether all is well."""
    kind, what = _accept(db_file)
    recorded = recorded_job_dirs(db_file)
    if kind == "missing" and not (recorded and held_jobs(db_file)):
        return [f"no job database at {db_file} yet"]
    lines = []
    healthy = kind == "mmm-orch"
    known: set[str] = set()
    if kind == "missing":
        lines.append("the file is missing")
    elif kind != "mmm-orch":
        lines.append(f"it is {what}, not an mmm-orch job database")
    else:
        try:
            conn = sqlite3.connect(f"{db_file.absolute().as_uri()}?mode=rw", uri=True)
            try:
                verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
                count = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
            finally:
                conn.close()
            if verdict != "ok":
                healthy = False
                lines.append(f"integrity check failed: {verdict}")
            else:
                lines.append(f"integrity check: ok, {count} jobs")
        except sqlite3.Error as exc:
            healthy = False
            lines.append(f"cannot be read: {describe(exc)}")
    backup = backup_path(db_file)
    if backup.is_file():
        age = time.time() - backup.stat().st_mtime
        lines.append(f"backup: {backup} ({age / 60:.0f} min old)")
    else:
        lines.append("backup: none yet (one is written with the next submission)")
    if healthy:
        rows, _, _ = _readable_rows(db_file)
        known = {row["job_dir"] for row in rows}
    missing = recorded - known
    if missing:
        healthy = False
        lines.append(f"{len(missing)} job directories have a {RECORD_FILE} but no database record")
    lines.insert(
        0, f"{db_file}: " + ("healthy" if healthy else "NEEDS RECOVERY: run `mmm-orch db recover`")
    )
    return lines


def recover(db_file: Path) -> tuple[Path | None, Report]:
    """Rebuild the database; returns where the old file was moved and what was found."""
    report = gather(db_file, read_db=_accept(db_file)[0] == "mmm-orch")
    if not report.rows:
        raise MmmError(
            f"nothing to recover for {db_file}: no readable database rows, no backup "
            f"and no {RECORD_FILE} in {jobs_root_for(db_file)}"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    fresh = db_file.with_name(f".{db_file.name}.recovering-{stamp}")
    new = JobDB(fresh)
    used: set[int] = set()
    rows = sorted(report.rows.values(), key=lambda r: r.get("submitted_at") or 0)
    columns = {row["name"] for row in new.conn.execute("PRAGMA table_info(jobs)")}
    with new.write():
        for row in rows:
            values = {k: v for k, v in row.items() if k in columns}
            if values.get("id") in used or values.get("id") is None:
                values.pop("id", None)
            cur = new.conn.execute(
                f"INSERT INTO jobs ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )
            assert cur.lastrowid is not None  # set by the INSERT just made
            used.add(cur.lastrowid)
            events = report.events.get(row["job_dir"]) or [
                (values.get("submitted_at") or time.time(), values["state"], "", "recovered")
            ]
            new.conn.executemany(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)", [(cur.lastrowid, *e) for e in events]
            )
        # Ids continue above every id given before (refused submissions' too), none reused.
        mark = read_mark(db_file) or 0
        new.conn.execute(
            "UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs' AND seq < ?", (mark, mark)
        )
    last = new.last_id()
    new.close()
    moved = None
    if db_file.exists():
        moved = db_file.with_name(f"{db_file.name}.damaged-{stamp}")
        db_file.replace(moved)
        for suffix in ("-wal", "-shm"):
            side = db_file.with_name(db_file.name + suffix)
            if side.exists():
                side.replace(moved.with_name(moved.name + suffix))
    fresh.replace(db_file)
    for suffix in ("-wal", "-shm"):
        fresh.with_name(fresh.name + suffix).unlink(missing_ok=True)
    write_mark(db_file, last)
    return moved, report
