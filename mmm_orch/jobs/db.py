"""The job database: SQLite in WAL mode, safe for many mmm-orch processes at once.

Every write is one short IMMEDIATE transaction (a writer waits for the lock instead of failing,
up to busy_timeout), so concurrent submits never lose or corrupt a record. Records are only
added after the scheduler accepted the job: a failed submission leaves nothing behind.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

from mmm_orch.schedulers.states import JobState, JobStatus, advance

SCHEMA_VERSION = 2  # 2: jobs.remote
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    machine      TEXT NOT NULL,
    host         TEXT NOT NULL,
    remote       TEXT NOT NULL DEFAULT '',  -- SSH target the job went through, '' for here
    scheduler    TEXT NOT NULL,      -- kind: slurm, pbs, local
    commands     TEXT NOT NULL,      -- JSON: the profile's scheduler commands at submit time
    workload     TEXT NOT NULL,
    name         TEXT NOT NULL,
    nodes        INTEGER NOT NULL,
    ranks        INTEGER NOT NULL,
    native_id    TEXT NOT NULL,
    job_dir      TEXT NOT NULL,
    script_path  TEXT NOT NULL,
    script       TEXT NOT NULL,      -- the exact script that was submitted
    plan         TEXT NOT NULL,      -- JSON
    submit_dir   TEXT NOT NULL,
    git_commit   TEXT,
    log_path     TEXT NOT NULL,
    state        TEXT NOT NULL,
    native_state TEXT NOT NULL DEFAULT '',
    reason       TEXT NOT NULL DEFAULT '',
    exit_code    INTEGER,
    signal       INTEGER,
    submitted_at REAL NOT NULL,
    started_at   REAL,
    ended_at     REAL,
    checked_at   REAL NOT NULL       -- last time the scheduler answered for this job
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS events (
    job_id       INTEGER NOT NULL REFERENCES jobs(id),
    at           REAL NOT NULL,
    state        TEXT NOT NULL,
    native_state TEXT NOT NULL,
    reason       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id);
"""
_OPEN_STATES = tuple(s.value for s in JobState if not s.terminal)



@dataclass(frozen=True)
class JobRecord:
    id: int
    machine: str
    host: str
    remote: str
    scheduler: str
    commands: dict[str, str]
    workload: str
    name: str
    nodes: int
    ranks: int
    native_id: str
    job_dir: str
    script_path: str
    submit_dir: str
    git_commit: str | None
    log_path: str
    state: JobState
    native_state: str
    reason: str
    exit_code: int | None
    signal: int | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    checked_at: float
    # Only get() fills these; listings leave them out to stay fast with thousands of jobs.
    script: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def elapsed(self, now: float | None = None) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or now or time.time()) - self.started_at

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["state"] = self.state.value
        if not full:
            for key in ("script", "plan", "events", "commands"):
                data.pop(key)
        return data


class JobDB:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.conn = sqlite3.connect(path, timeout=60, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA busy_timeout = 60000")
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            with self._write():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                if version == 1:
                    self.conn.execute("ALTER TABLE jobs ADD COLUMN remote TEXT NOT NULL DEFAULT ''")
                self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self.conn.close()

    def _write(self):
        return _Immediate(self.conn)

    @staticmethod
    def jobs_root_for(db_path: Path) -> Path:
        """Per-job directories (script copy, log, local supervisor files) sit beside the db."""
        return db_path.parent / "jobs"

    def insert(self, **values: Any) -> int:
        now = time.time()
        values = {**values, "commands": json.dumps(values["commands"]),
                  "plan": json.dumps(values["plan"]), "checked_at": now,
                  "state": values.get("state", JobState.PENDING.value)}
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self._write():
            cur = self.conn.execute(f"INSERT INTO jobs ({columns}) VALUES ({marks})",
                                    list(values.values()))
            job_id = cur.lastrowid
            self.conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                              (job_id, now, values["state"], "submitted", ""))
        return int(job_id)

    def get(self, job_id: int, events: bool = True) -> JobRecord | None:
        row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            return None
        record = _record(row)
        if events:
            record.events.extend(dict(e) for e in self.conn.execute(
                "SELECT at, state, native_state, reason FROM events WHERE job_id = ? ORDER BY at",
                (job_id,)))
        return record

    def list(self, *, ids: Iterable[int] = (), open_only: bool = False, limit: int | None = None,
             machine: str | None = None) -> list[JobRecord]:
        where, args = [], []
        ids = list(ids)
        if ids:
            where.append(f"id IN ({','.join('?' * len(ids))})")
            args += ids
        if open_only:
            where.append(f"state IN ({','.join('?' * len(_OPEN_STATES))})")
            args += _OPEN_STATES
        if machine:
            where.append("machine = ?")
            args.append(machine)
        sql = f"SELECT {_list_columns()} FROM jobs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [_record(row) for row in self.conn.execute(sql, args)][::-1]

    def apply(self, updates: dict[int, JobStatus], now: float | None = None) -> None:
        """Record what the scheduler said, in one transaction; states only move forward."""
        if not updates:
            return
        now = now or time.time()
        changes, events = [], []
        with self._write():
            rows = {row["id"]: row for row in self.conn.execute(
                "SELECT id, state, native_state, reason, started_at, ended_at FROM jobs "
                f"WHERE id IN ({','.join('?' * len(updates))})", list(updates))}
            for job_id, status in updates.items():
                row = rows.get(job_id)
                if row is None:
                    continue
                current = JobState(row["state"])
                new = advance(current, status.state)
                # The scheduler's own times when it gives them, else when we first saw the change.
                started, ended = row["started_at"], row["ended_at"]
                if status.started_at and new is not JobState.PENDING:
                    started = status.started_at
                if new is JobState.RUNNING and started is None:
                    started = now
                if new.terminal and not current.terminal:
                    ended = status.ended_at or now
                    if started is None and new is not JobState.CANCELLED:
                        started = ended  # finished between two looks, with no start on record
                if new.terminal and current.terminal:
                    continue  # terminal records are final
                native = status.native_state or row["native_state"]
                reason = status.reason
                # A cancelled or timed-out job's "0" says nothing; a non-zero code or signal does.
                code = status.exit_code if new.terminal else None
                if new in (JobState.CANCELLED, JobState.TIMEOUT) and not code:
                    code = None
                changes.append((new.value, native, reason, code,
                                status.signal if new.terminal else None, started, ended, now, job_id))
                if new is not current or native != row["native_state"] or reason != row["reason"]:
                    events.append((job_id, now, new.value, native, reason))
            self.conn.executemany(
                "UPDATE jobs SET state = ?, native_state = ?, reason = ?, exit_code = ?, "
                "signal = ?, started_at = ?, ended_at = ?, checked_at = ? WHERE id = ?", changes)
            self.conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", events)

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]


class _Immediate:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): take the write lock up front."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _list_columns() -> str:
    return ", ".join(f.name for f in fields(JobRecord) if f.name not in ("script", "plan", "events"))


def _record(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data["commands"] = json.loads(data["commands"])
    if "plan" in data:
        data["plan"] = json.loads(data["plan"])
    data["state"] = JobState(data["state"])
    return JobRecord(**data)


def db_path(path: str | None = None) -> Path:
    """`path`, else $MMM_ORCH_DB, else $XDG_STATE_HOME/mmm-orch/jobs.db."""
    from mmm_orch.paths import default_db_path

    return Path(path) if path else default_db_path()


def open_db(path: str | None = None) -> JobDB:
    return JobDB(db_path(path))
