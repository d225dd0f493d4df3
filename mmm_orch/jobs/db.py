"""The job database: SQLite in WAL mode, safe for many mmm-orch processes at once.

Every write is one short IMMEDIATE transaction (a writer waits for the lock instead of failing,
up to busy_timeout), so concurrent submits never lose or corrupt a record. A record is written
*before* the scheduler is asked (state `submitting`), so an interrupted submit always leaves a
trace that the next `status` reconciles; a submission the scheduler refused is removed again.

The database is checked before anything is done with it (a directory, a foreign file, a truncated
or damaged database, a read-only place, a full disk: one clear error, exit 2, nothing written).
mmm-orch's databases carry its mark in the SQLite header (application_id), set at creation; those
of earlier versions are known by their tables, and marked. A high-water mark beside the database
(jobs.db.last-id, the highest job id it recorded) shows a database that was replaced or rolled
back: it is refused until `db recover`. Two copies make recovery real: `jobs.db.backup` (SQLite's
online backup, refreshed at most every BACKUP_EVERY seconds by a writer) and one `record.json` per
job in its directory beside the database. `mmm-orch db recover` rebuilds from the damaged file,
the backup and those records.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import sqlite3
import stat
import struct
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from mmm_orch.config.common import NODE_NAME
from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import RECORD_FILE
from mmm_orch.schedulers.states import JobState, JobStatus, advance

SCHEMA_VERSION = 4  # 2: jobs.remote; 3: tag, submitter, run_dir, groups; 4: spares, bad_nodes
SQLITE_HEADER = b"SQLite format 3\x00"
# Set in the SQLite header ("mmmo") when mmm-orch creates a database, so that a file is known to
# be one of ours before anything is written to it. Earlier versions' (0) go by their tables.
APPLICATION_ID = 0x6D6D6D6F
MARK_SUFFIX = ".last-id"  # beside the database: the highest job id it ever recorded
ALLOWED = ("--db and $MMM_ORCH_DB must name an mmm-orch job database, or a path where none exists "
           "yet (the first `mmm-orch submit` creates it there)")
BACKUP_EVERY = 600.0
CANCEL_SENT = "cancel sent by mmm-orch"  # the reason of the event that records a cancel request
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
# Columns added after the first schema, created on older databases by _build().
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
# What a database of mmm-orch 0.1.0 (before APPLICATION_ID) holds at least, and at most.
_FIRST_JOB_COLUMNS = {
    "id", "machine", "host", "scheduler", "commands", "workload", "name", "nodes", "ranks",
    "native_id", "job_dir", "script_path", "script", "plan", "submit_dir", "git_commit", "log_path",
    "state", "native_state", "reason", "exit_code", "signal", "submitted_at", "started_at",
    "ended_at", "checked_at"}
_EVENT_COLUMNS = {"job_id", "at", "state", "native_state", "reason"}
_OUR_TABLES = {"jobs", "events", "bad_nodes", "groups"}
_SPECIAL_FILES = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket",
                  stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


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


MAX_BAD_NODE_DAYS = 3650


def bad_node_days() -> float:
    """How long a blamed node stays avoided: $MMM_ORCH_BAD_NODE_DAYS, else 7 days."""
    text = os.environ.get("MMM_ORCH_BAD_NODE_DAYS", "7")
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not 0 <= days <= MAX_BAD_NODE_DAYS:  # also nan, inf and 1e308 (a date past year 9999)
        raise MmmError(f"MMM_ORCH_BAD_NODE_DAYS {text!r} is invalid: days, a number from 0 to "
                       f"{MAX_BAD_NODE_DAYS}")
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
    if not _connected[key]:  # else already open here, and reading it again would drop the locks
        if check_file(file) == "missing":
            refuse_lost_jobs(file, 0, set)
            if not create:
                return None
    db = JobDB(file)
    try:
        db.check_complete()
    except BaseException:
        db.close()
        raise
    _open[key] = db
    return db


def close_all() -> None:
    while _open:
        _open.popitem()[1].close()


def identify(file: Path) -> tuple[str, str]:
    """What `file` is, found without writing anything: (kind, what it is in words), kind one of
    missing, empty, mmm-orch, newer (an mmm-orch database this version does not know), foreign."""
    try:
        mode = file.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # a file in the way: check_file says which
        return "missing", ""
    except OSError as exc:
        raise DatabaseError(f"job database {file}: cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        return "foreign", "a directory"
    if not stat.S_ISREG(mode):
        return "foreign", _SPECIAL_FILES.get(stat.S_IFMT(mode), "not a regular file")
    try:
        # Non-blocking: a FIFO put there since the stat must not hang the command.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "foreign", "not a regular file"
            head = os.read(fd, 100)
        finally:
            os.close(fd)
    except OSError as exc:
        raise DatabaseError(f"job database {file}: cannot read: {exc.strerror}") from None
    if not head:
        return "empty", "an empty file (0 bytes)"
    if len(head) < 100 or not head.startswith(SQLITE_HEADER):
        return "foreign", f"not an SQLite database (it starts with {head[:8]!r})"
    version, app = struct.unpack(">i4xi", head[60:72])  # the header's user_version, application_id
    if app == APPLICATION_ID:
        return _by_version(version)
    if app != 0:
        return "foreign", f"an SQLite database of another program (application id {app:#x})"
    try:  # immutable: reads only, and never leaves -wal or -shm files beside a foreign database
        conn = sqlite3.connect(f"{file.absolute().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            return _by_tables(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return "foreign", f"an SQLite file that cannot be read ({exc})"


def _by_version(version: int) -> tuple[str, str]:
    if version > SCHEMA_VERSION:
        return "newer", (f"a job database of a newer mmm-orch (schema {version}; this one knows "
                         f"up to {SCHEMA_VERSION})")
    return "mmm-orch", ""


def _by_tables(conn: sqlite3.Connection) -> tuple[str, str]:
    """A database without mmm-orch's mark: one of an earlier mmm-orch has its tables, only them."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if not row[0].startswith("sqlite_")}
    if not tables:
        return "foreign", "an SQLite database with no tables that mmm-orch did not create"

    def columns(table: str) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}

    if not ({"jobs", "events"} <= tables <= _OUR_TABLES and _FIRST_JOB_COLUMNS <= columns("jobs")
            and _EVENT_COLUMNS <= columns("events")):
        shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        return "foreign", f"an SQLite database of another program (tables: {shown})"
    return _by_version(conn.execute("PRAGMA user_version").fetchone()[0])


def check_file(file: Path) -> str:
    """Refuse what is not a usable job database, before anything is written: anything but a
    missing file or an mmm-orch database is left exactly as it is. Returns the kind (identify)."""
    kind, what = identify(file)
    if kind == "missing":
        parent = next((p for p in file.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise DatabaseError(f"job database {file}: {parent} is a file, not a directory")
    if kind in ("missing", "mmm-orch"):
        return kind
    if kind == "newer":
        raise DatabaseError(f"job database {file} is {what}; it was left as it is: use that newer "
                            "mmm-orch, or name another file with --db")
    if kind == "empty" and (evidence := earlier_records(file)):
        raise DatabaseError(
            f"job database {file} is empty (0 bytes) but {evidence}: it was truncated. "
            f"Nothing was written; `mmm-orch db recover` rebuilds it from the backup and "
            f"the job directories (the empty file is kept aside)")
    lost = len(recorded_job_dirs(file)) if held_jobs(file) else 0
    raise DatabaseError(
        f"job database {file} is {what}, not an mmm-orch job database; it was left as it is. "
        + (f"It lacks the {lost} jobs recorded in {jobs_root_for(file)}: if it replaced the job "
           "database, `mmm-orch db recover` sets it aside unchanged and rebuilds the database"
           if lost else ALLOWED))


def held_jobs(file: Path) -> bool:
    """Whether an mmm-orch database at this very path once recorded jobs (its high-water mark or
    its backup; the job directories are shared by every database in the same directory)."""
    return bool(read_mark(file)) or backup_path(file).is_file()


def earlier_records(file: Path) -> str:
    """What shows that a database at `file` once held jobs: its mark, backup, or job directories."""
    if mark := read_mark(file):
        return f"it recorded jobs up to id {mark}"
    backup = backup_path(file)
    if backup.is_file() and backup.stat().st_size:
        return f"its backup {backup.name} exists"
    root = jobs_root_for(file)
    with contextlib.suppress(OSError):
        count = sum(1 for d in root.iterdir() if (d / RECORD_FILE).is_file())
        if count:
            return f"{count} job directories with records exist in {root}"
    return ""


def job_records(root: Path) -> list[dict[str, Any]]:
    """Every job's own record.json under `root` (what `db recover` rebuilds from)."""
    records = []
    with contextlib.suppress(OSError):
        for directory in sorted(root.iterdir()):
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads((directory / RECORD_FILE).read_text()))
    return records


def recorded_job_dirs(file: Path) -> set[str]:
    return {r["job_dir"] for r in job_records(jobs_root_for(file))
            if isinstance(r, dict) and isinstance(r.get("job_dir"), str)}


# -- the high-water mark: a replaced or rolled-back database is noticed ------------------------

def mark_path(db_file: Path) -> Path:
    return db_file.with_name(db_file.name + MARK_SUFFIX)


def read_mark(db_file: Path) -> int | None:
    """The highest job id the database at `db_file` recorded; None where no mark was kept."""
    try:
        return int(mark_path(db_file).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0  # unreadable: no evidence either way (not rewritten: someone else's doing)


def write_mark(db_file: Path, job_id: int) -> None:
    """Atomically; a mark that cannot be written only weakens the check, it fails nothing."""
    target = mark_path(db_file)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(f"{job_id}\n")
        tmp.replace(target)
    except OSError:
        tmp.unlink(missing_ok=True)


def refuse_lost_jobs(file: Path, last_id: int, known: Callable[[], set[str]]) -> None:
    """Refuse a database (or its absence) that lacks jobs it once recorded: whose highest job id
    is below the mark, and whose job directories record jobs it does not have. Directories are
    listed only when the mark says so; `known()` (the job_dirs the database has) is asked after,
    since a job's record.json is written after its row."""
    mark = read_mark(file)
    if not mark or mark <= last_id:
        return
    recorded = recorded_job_dirs(file)
    lost = len(recorded - known()) if recorded else 0
    if lost:
        where = f"job database {file} " + ("is missing" if last_id == 0 and not file.exists()
                                             else "was replaced or rolled back")
        raise DatabaseError(
            f"{where}: it lacks {lost} of the jobs recorded in {jobs_root_for(file)} (its jobs "
            f"reached id {mark}). Nothing was written; `mmm-orch db recover` rebuilds it from its "
            f"backup and the job directories (the current file is kept aside)")


def create_file(file: Path) -> None:
    """A new job database at `file`, marked as mmm-orch's. Built aside and linked into place, so
    that no process ever sees it half made: an empty file at `file` is never one of ours."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise DatabaseError(f"job database {file}: cannot create {file.parent}: "
                            f"{exc.strerror}") from None
    tmp = file.with_name(f".{file.name}.{os.getpid()}.new")
    try:
        tmp.unlink(missing_ok=True)  # left by a killed process of the same pid
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("BEGIN")
            _build(conn)
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):  # another mmm-orch made it meanwhile: use that
            os.link(tmp, file)
    except sqlite3.Error as exc:
        raise DatabaseError(f"job database {file}: cannot create: {describe(exc)}") from None
    except OSError as exc:
        reason = {errno.ENOSPC: "the disk is full",
                  errno.EROFS: "cannot write there (read-only place)",
                  errno.EACCES: "cannot write there (no permission)"}.get(exc.errno, exc.strerror)
        raise DatabaseError(f"job database {file}: cannot create: {reason}") from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _build(conn: sqlite3.Connection) -> None:
    """Create what is missing (tables, indexes, columns added since: all have defaults) and mark
    the file as mmm-orch's, of this schema version."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in have:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


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
        """Open the job database at `path`, creating it where there is none; a file that is not
        an mmm-orch database is refused before anything is written to it."""
        self.path = path
        if not path.exists():
            create_file(path)
        with self._errors("open"):
            # mode=rw: never creates a file (a path removed since would be an empty, unmarked one)
            self.conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True,
                                        timeout=60, isolation_level=None)
            _connected[path.absolute()] += 1
        try:
            with self._errors("open"):
                self._prepare()
        except BaseException:
            self.close()
            raise

    def _prepare(self) -> None:
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA busy_timeout = 60000")
        app = self.conn.execute("PRAGMA application_id").fetchone()[0]
        kind, what = _by_version(self.conn.execute("PRAGMA user_version").fetchone()[0])
        if app != APPLICATION_ID:
            kind, what = ("foreign", f"an SQLite database of another program (application id "
                          f"{app:#x})") if app else _by_tables(self.conn)
        if kind != "mmm-orch":
            raise DatabaseError(f"job database {self.path} is {what}, not one this mmm-orch "
                                f"can use; it was left as it is. {ALLOWED}")
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        if app != APPLICATION_ID or self.conn.execute(
                "PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            with self._write():  # one of an earlier mmm-orch: upgraded, and marked as ours
                _build(self.conn)

    def check_complete(self) -> None:
        """Refuse the database if it lacks jobs it once recorded (see refuse_lost_jobs); cheap:
        one small file and one row read. Keeps a mark where there was none (earlier versions)."""
        mark = read_mark(self.path)
        last = self.last_id()
        if mark is None and last:
            write_mark(self.path, last)
        refuse_lost_jobs(self.path, last, self.job_dirs)

    def last_id(self) -> int:
        """The highest job id ever given (refused submissions' ids included: never reused)."""
        with self._errors("read"):
            row = self.conn.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        return row[0] if row else 0

    def job_dirs(self) -> set[str]:
        with self._errors("read"):
            return {row[0] for row in self.conn.execute("SELECT job_dir FROM jobs")}

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
            write_mark(self.path, job_id)  # under the write lock: marks only ever rise
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
        return {**dict(row), "spec": stored_json(row["spec"], dict, f"group {group_id}'s spec")}

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
    data["commands"] = stored_json(data["commands"], dict, f"job {data['id']}'s scheduler commands")
    if "plan" in data:
        data["plan"] = stored_json(data["plan"], dict, f"job {data['id']}'s plan")
    try:
        data["state"] = JobState(data["state"])
    except ValueError:
        raise DatabaseError(f"job {data['id']}'s state {str(data['state'])[:40]!r} is not one "
                            "mmm-orch writes: the job database was changed by hand; "
                            "`mmm-orch db check` says more") from None
    return JobRecord(**data)


def stored_json(text: Any, kind: type, what: str) -> Any:
    """A JSON column as written by mmm-orch, or one line saying it was damaged."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        value = None
    if not isinstance(value, kind):
        raise DatabaseError(f"{what} in the job database is damaged (not the JSON {kind.__name__} "
                            "mmm-orch writes): it was changed by hand; `mmm-orch db check` says "
                            "more")
    return value
