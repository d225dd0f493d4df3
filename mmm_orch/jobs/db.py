"""The job database: SQLite in WAL mode, safe for many mmm-orch processes at once.

Every write is one short IMMEDIATE transaction (a writer waits for the lock instead of failing,
up to busy_timeout), so concurrent submits never lose or corrupt a record. A record is written
*before* the scheduler is asked (state `submitting`), so an interrupted submit always leaves a
trace that the next `status` reconciles; a submission the scheduler refused is removed again.

The database is checked before anything is done with it (a directory, a foreign file, a truncated
or damaged database, a read-only place, a full disk: one clear error, exit 2, nothing written),
and two copies make recovery real: `jobs.db.backup` (SQLite's online backup, refreshed at most
every BACKUP_EVERY seconds by a writer) and one `record.json` per job in its directory beside the
database. `mmm-orch db recover` rebuilds from the damaged file, the backup and those records.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from mmm_orch.errors import MmmError
from mmm_orch.schedulers.states import JobState, JobStatus, advance

SCHEMA_VERSION = 4  # 2: jobs.remote; 3: tag, submitter, run_dir, groups; 4: spares, bad_nodes
SQLITE_HEADER = b"SQLite format 3\x00"
BACKUP_EVERY = 600.0
RECORD_FILE = "record.json"
CANCEL_SENT = "cancel sent by mmm-orch"  # the reason of the event that records a cancel request
# What bad_nodes keeps: host names, and PBS vnode names (`host[3]`).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\[\]-]{0,62}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    machine      TEXT NOT NULL,
    host         TEXT NOT NULL,
    scheduler    TEXT NOT NULL,      -- kind: slurm, pbs, local
    commands     TEXT NOT NULL,      -- JSON: the profile's scheduler commands at submit time
    workload     TEXT NOT NULL,
    name         TEXT NOT NULL,
    nodes        INTEGER NOT NULL,
    ranks        INTEGER NOT NULL,
    native_id    TEXT NOT NULL,      -- '' while submitting
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
CREATE TABLE IF NOT EXISTS bad_nodes (
    machine      TEXT NOT NULL,
    node         TEXT NOT NULL,
    at           REAL NOT NULL,      -- when it was last blamed
    job_id       INTEGER,            -- by which job
    evidence     TEXT NOT NULL,      -- the log line that named it
    PRIMARY KEY (machine, node)
);
CREATE TABLE IF NOT EXISTS groups (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    kind         TEXT NOT NULL,      -- chain or sweep
    created_at   REAL NOT NULL,
    spec         TEXT NOT NULL       -- JSON: what was asked (links, axes and points)
);
"""
# Columns added after the first schema, created on older databases by _migrate().
_ADDED_COLUMNS = {
    "remote": "TEXT NOT NULL DEFAULT ''",     # SSH target the job went through, '' for here
    "tag": "TEXT NOT NULL DEFAULT ''",        # the mark the scheduler shows (comment, variable)
    "submitter": "TEXT NOT NULL DEFAULT ''",  # JSON: host, pid, start of the submitting process
    "run_dir": "TEXT NOT NULL DEFAULT ''",    # where the trainer writes metrics and checkpoints
    "group_id": "INTEGER",                    # the chain or sweep the job belongs to
    "group_index": "INTEGER",                 # its link (chains) or point (sweeps), from 1
    "rerun_of": "INTEGER",                    # the job this one reruns
    "spares": "INTEGER NOT NULL DEFAULT 0",   # spare nodes the job holds for failover
}
_OPEN_STATES = tuple(s.value for s in JobState if not s.terminal)


class DatabaseError(MmmError):
    """The job database cannot be used as it is; nothing was written."""


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
    tag: str = ""
    submitter: str = ""
    run_dir: str = ""
    group_id: int | None = None
    group_index: int | None = None
    rerun_of: int | None = None
    spares: int = 0
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
            for key in ("script", "plan", "events", "commands", "submitter"):
                data.pop(key)
        return data


def db_path(path: str | None = None) -> Path:
    """`path`, else $MMM_ORCH_DB, else $XDG_STATE_HOME/mmm-orch/jobs.db."""
    from mmm_orch.paths import default_db_path

    return Path(path) if path else default_db_path()


def bad_node_days() -> float:
    """How long a blamed node stays avoided: $MMM_ORCH_BAD_NODE_DAYS, else 7 days."""
    text = os.environ.get("MMM_ORCH_BAD_NODE_DAYS", "7")
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not days >= 0:
        raise MmmError(f"MMM_ORCH_BAD_NODE_DAYS {text!r} is invalid: days, a number >= 0")
    return days


def jobs_root_for(db_file: Path) -> Path:
    """Per-job directories (script copy, log, record.json, local supervisor files) beside the db."""
    return db_file.parent / "jobs"


def backup_path(db_file: Path) -> Path:
    return db_file.with_name(db_file.name + ".backup")


_open: dict[Path, JobDB] = {}
_connected: collections.Counter[Path] = collections.Counter()  # live connections per file


def open_db(path: str | None = None, create: bool = False) -> JobDB | None:
    """The checked job database; None when there is none yet and `create` is False (commands
    that only read never create one). One connection per file and process: SQLite's locks are
    POSIX locks, which any other open-and-close of the file in the same process would drop."""
    file = db_path(path)
    key = file.absolute()
    if key in _open:
        return _open[key]
    check_file(file)
    if not file.exists() and not create:
        return None
    _open[key] = JobDB(file)
    return _open[key]


def close_all() -> None:
    while _open:
        _open.popitem()[1].close()


def check_file(file: Path) -> None:
    """Refuse what is not a usable job database, before anything is written."""
    if file.is_dir():
        raise DatabaseError(f"job database {file}: is a directory, not a database file "
                            "(--db or $MMM_ORCH_DB names the file, e.g. .../jobs.db)")
    if not file.exists():
        parent = next((p for p in file.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise DatabaseError(f"job database {file}: {parent} is a file, not a directory")
        return
    if _connected[file.absolute()]:
        return  # already open here, so a database; reading it again would drop SQLite's locks
    try:
        with open(file, "rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseError(f"job database {file}: cannot read: {exc.strerror}") from None
    if not head:
        evidence = _earlier_records(file)
        if evidence:
            raise DatabaseError(
                f"job database {file} is empty (0 bytes) but {evidence}: it was truncated. "
                f"Nothing was written; `mmm-orch db recover` rebuilds it from the backup and "
                f"the job directories (the empty file is kept aside)")
        return
    if head != SQLITE_HEADER:
        raise DatabaseError(f"job database {file}: not an SQLite database (it starts with "
                            f"{head[:8]!r}); name another file with --db, or move this one away")


def _earlier_records(file: Path) -> str:
    """What shows that a database at `file` once held jobs: its backup, or job directories."""
    backup = backup_path(file)
    if backup.is_file() and backup.stat().st_size:
        return f"its backup {backup.name} exists"
    root = jobs_root_for(file)
    with contextlib.suppress(OSError):
        count = sum(1 for d in root.iterdir() if (d / RECORD_FILE).is_file())
        if count:
            return f"{count} job directories with records exist in {root}"
    return ""


def describe(exc: sqlite3.Error) -> str:
    """One line for an SQLite failure: what it means for the user."""
    text = str(exc)
    if "disk is full" in text or "disk I/O error" in text:
        return f"the disk is full or failing ({text})"
    if "readonly" in text or "unable to open" in text or "access permission" in text:
        return f"cannot write there (read-only place or no permission: {text})"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (f"the database is damaged ({text}); `mmm-orch db check` says more and "
                "`mmm-orch db recover` rebuilds it from its backup and the job directories")
    if "locked" in text or "busy" in text:
        return f"another mmm-orch holds it for too long ({text}); try again"
    return text


class JobDB:
    def __init__(self, path: Path):
        self.path = path
        with self._errors("open"):
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise DatabaseError(f"job database {path}: cannot create {path.parent}: "
                                    f"{exc.strerror}") from None
            self.conn = sqlite3.connect(path, timeout=60, isolation_level=None)
            _connected[path.absolute()] += 1
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA busy_timeout = 60000")
            if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            if self.conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                self._migrate()

    def _migrate(self) -> None:
        """Create what is missing: tables, indexes, and columns added since (all have defaults)."""
        with self._write():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.conn.execute(statement)
            have = {row["name"] for row in self.conn.execute("PRAGMA table_info(jobs)")}
            for name, kind in _ADDED_COLUMNS.items():
                if name not in have:
                    self.conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
            self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise DatabaseError(f"job database {self.path}: cannot {doing}: {describe(exc)}") from None

    def close(self) -> None:
        self.conn.close()
        _connected[self.path.absolute()] -= 1

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): take the write lock up front."""
        with self._errors("write"):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    # -- writes ------------------------------------------------------------------------------

    def insert(self, **values: Any) -> int:
        """A new record (state `submitting` unless given); returns its id."""
        now = time.time()
        values = {**values, "commands": json.dumps(values["commands"]),
                  "plan": json.dumps(values["plan"]), "checked_at": now,
                  "state": values.get("state", JobState.SUBMITTING.value)}
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self._write():
            cur = self.conn.execute(f"INSERT INTO jobs ({columns}) VALUES ({marks})",
                                    list(values.values()))
            job_id = int(cur.lastrowid)
            self.conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                              (job_id, now, values["state"], "", "recorded before submission"))
        self._refresh_backup()
        return job_id

    def accepted(self, job_id: int, native_id: str, note: str = "submitted") -> None:
        """The scheduler took the job under `native_id`: it is pending from now on."""
        now = time.time()
        with self._write():
            self.conn.execute("UPDATE jobs SET native_id = ?, state = ?, checked_at = ? "
                              "WHERE id = ? AND state = ?",
                              (native_id, JobState.PENDING.value, now, job_id,
                               JobState.SUBMITTING.value))
            self.conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                              (job_id, now, JobState.PENDING.value, "", note))

    def cancel_sent(self, job_id: int) -> None:
        """mmm-orch asked the scheduler to cancel the job (an end it then calls a success, as PBS
        can after a server restart, is read as cancelled: see track)."""
        with self._write():
            self.conn.execute("INSERT INTO events SELECT id, ?, state, '', ? FROM jobs WHERE id = ?",
                              (time.time(), CANCEL_SENT, job_id))

    def cancels_sent(self, job_ids: list[int]) -> set[int]:
        """Which of `job_ids` mmm-orch asked the scheduler to cancel."""
        marks = ", ".join("?" for _ in job_ids)
        return {row[0] for row in self.conn.execute(
            f"SELECT DISTINCT job_id FROM events WHERE reason = ? AND job_id IN ({marks})",
            (CANCEL_SENT, *job_ids))}

    def note(self, job_id: int, reason: str) -> None:
        """Say why a record is as it is (e.g. a submission whose outcome is not known yet)."""
        with self._write():
            self.conn.execute("UPDATE jobs SET reason = ? WHERE id = ?", (reason, job_id))

    def delete(self, job_id: int) -> None:
        """Remove the record of a job the scheduler never took (rejected, or never asked)."""
        with self._write():
            self.conn.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
            self.conn.execute("DELETE FROM jobs WHERE id = ? AND state = ?",
                              (job_id, JobState.SUBMITTING.value))

    def new_group(self, kind: str, spec: dict[str, Any]) -> int:
        with self._write():
            cur = self.conn.execute("INSERT INTO groups (kind, created_at, spec) VALUES (?, ?, ?)",
                                    (kind, time.time(), json.dumps(spec)))
            return int(cur.lastrowid)

    def group(self, group_id: int) -> dict[str, Any] | None:
        with self._errors("read"):
            row = self.conn.execute("SELECT * FROM groups WHERE id = ?", (group_id,)).fetchone()
        if row is None:
            return None
        return {**dict(row), "spec": json.loads(row["spec"])}

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

    # -- reads -------------------------------------------------------------------------------

    def get(self, job_id: int, events: bool = True) -> JobRecord | None:
        with self._errors("read"):
            row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            record = _record(row)
            if events:
                record.events.extend(dict(e) for e in self.conn.execute(
                    "SELECT at, state, native_state, reason FROM events WHERE job_id = ? "
                    "ORDER BY at", (job_id,)))
        return record

    def list(self, *, ids: Iterable[int] = (), open_only: bool = False, limit: int | None = None,
             machine: str | None = None, group_id: int | None = None) -> list[JobRecord]:
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
        if group_id is not None:
            where.append("group_id = ?")
            args.append(group_id)
        sql = f"SELECT {_list_columns()} FROM jobs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        with self._errors("read"):
            return [_record(row) for row in self.conn.execute(sql, args)][::-1]

    def count(self) -> int:
        with self._errors("read"):
            return self.conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]

    def id_range(self) -> tuple[int, int] | None:
        """The lowest and highest job id recorded (ids of refused submissions are not reused)."""
        with self._errors("read"):
            low, high = self.conn.execute("SELECT MIN(id), MAX(id) FROM jobs").fetchone()
        return None if low is None else (low, high)

    def machines(self) -> set[str]:
        with self._errors("read"):
            return {row[0] for row in self.conn.execute("SELECT DISTINCT machine FROM jobs")}

    # -- nodes known to be bad ----------------------------------------------------------------

    def blame_node(self, machine: str, node: str, evidence: str, job_id: int | None) -> None:
        """Remember `node` as bad on `machine`; the same job blaming it again changes nothing
        (its expiry runs from the first time). A name that is not a host name is not kept: it
        goes into later jobs' directives."""
        if not NODE_NAME.match(node):
            return
        with self._write():
            self.conn.execute(
                "INSERT INTO bad_nodes VALUES (?, ?, ?, ?, ?) ON CONFLICT (machine, node) DO UPDATE "
                "SET at = excluded.at, job_id = excluded.job_id, evidence = excluded.evidence "
                "WHERE bad_nodes.job_id IS NOT excluded.job_id",
                (machine, node, time.time(), job_id, evidence[:500]))

    def bad_node_rows(self, machine: str | None = None) -> list[dict[str, Any]]:
        """Unexpired entries (MMM_ORCH_BAD_NODE_DAYS, 7 by default), newest first."""
        since = time.time() - bad_node_days() * 86400
        sql = "SELECT * FROM bad_nodes WHERE at >= ?" + (" AND machine = ?" if machine else "")
        with self._errors("read"):
            rows = self.conn.execute(sql + " ORDER BY at DESC", (since, machine) if machine else (since,))
            return [dict(row) for row in rows]

    def bad_nodes(self, machine: str) -> list[str]:
        return sorted(row["node"] for row in self.bad_node_rows(machine))

    def forget_node(self, node: str, machine: str | None = None) -> int:
        sql = "DELETE FROM bad_nodes WHERE node = ?" + (" AND machine = ?" if machine else "")
        with self._write():
            return self.conn.execute(sql, (node, machine) if machine else (node,)).rowcount

    # -- safety copies -----------------------------------------------------------------------

    def _refresh_backup(self, force: bool = False) -> None:
        """Copy the whole database to jobs.db.backup when the copy is older than BACKUP_EVERY.
        A failed backup never fails the write that triggered it."""
        target = backup_path(self.path)
        with contextlib.suppress(OSError):
            if not force and time.time() - target.stat().st_mtime < BACKUP_EVERY:
                return
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            copy = sqlite3.connect(tmp)
            try:
                self.conn.backup(copy)
            finally:
                copy.close()
            os.chmod(tmp, 0o600)
            tmp.replace(target)
        except (sqlite3.Error, OSError):
            tmp.unlink(missing_ok=True)

    def backup(self) -> Path:
        self._refresh_backup(force=True)
        return backup_path(self.path)


def _list_columns() -> str:
    return ", ".join(f.name for f in fields(JobRecord) if f.name not in ("script", "plan", "events"))


def _record(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data["commands"] = json.loads(data["commands"])
    if "plan" in data:
        data["plan"] = json.loads(data["plan"])
    data["state"] = JobState(data["state"])
    return JobRecord(**data)
