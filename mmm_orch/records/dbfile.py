"""The job database file: what a path holds (ours, an earlier version of ours, a newer one,
someone else's, nothing), creating it marked as ours, its high-water mark beside it, and the
job directories that know every job it recorded. Nothing here writes to a file that is not
mmm-orch's own; records/db.py works on the database once it has been found to be ours.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import RECORD_FILE
from mmm_orch.planning.cost import ended_charge
from mmm_orch.planning.store import section
from mmm_orch.schedulers.states import TERMINAL

SCHEMA_VERSION = 9  # 2: jobs.remote; 3: tag, submitter, run_dir, groups; 4: spares, bad_nodes;
# 5: account and the charge; 6: group_plans; 7: the backlog (waited_since, leases); 8: screen;
# 9: the end class
SQLITE_HEADER = b"SQLite format 3\x00"
# Set in the SQLite header ("mmmo") when mmm-orch creates a database, so that a file is known to
# be one of ours before anything is written to it. Earlier versions' (0) go by their tables.
APPLICATION_ID = 0x6D6D6D6F
MARK_SUFFIX = ".last-id"  # beside the database: the highest job id it ever recorded
ALLOWED = (
    "--db and $MMM_ORCH_DB must name an mmm-orch job database, or a path where none exists "
    "yet (the first `mmm-orch submit` creates it there)"
)
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
CREATE TABLE IF NOT EXISTS leases (  -- who moves the backlog now (records/waiting.py)
    name         TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,      -- JSON: host, pid, start of the holding process
    until        REAL NOT NULL       -- held until then unless renewed or released
);
CREATE TABLE IF NOT EXISTS group_plans (  -- a pack's points' plans, read only where they run
    group_id     INTEGER NOT NULL REFERENCES groups(id),
    idx          INTEGER NOT NULL,   -- the point, from 1
    plan         TEXT NOT NULL,      -- JSON
    PRIMARY KEY (group_id, idx)
);
"""
# Columns added after the first schema, created on older databases by build().
_ADDED_COLUMNS = {
    "remote": "TEXT NOT NULL DEFAULT ''",  # SSH target the job went through, '' for here
    "tag": "TEXT NOT NULL DEFAULT ''",  # the mark the scheduler shows (comment, variable)
    "submitter": "TEXT NOT NULL DEFAULT ''",  # JSON: host, pid, start of the submitting process
    "run_dir": "TEXT NOT NULL DEFAULT ''",  # where the trainer writes metrics and checkpoints
    "group_id": "INTEGER",  # the chain or sweep the job belongs to
    "group_index": "INTEGER",  # its link (chains) or point (sweeps), from 1
    "rerun_of": "INTEGER",  # the job this one reruns
    "spares": "INTEGER NOT NULL DEFAULT 0",  # spare nodes the job holds for failover
    "account": "TEXT NOT NULL DEFAULT ''",  # the project charged ('' where the machine has none)
    # Set once the job ended, from the scheduler's own accounting (planning/cost.py's rules):
    "charged_nodes": "INTEGER",  # the nodes it held
    "charged_seconds": "REAL",  # the time charged
    "charge": "REAL",  # in the machine's unit (node-hours)
    "waited_since": "REAL",  # when it entered the backlog (NULL: submitted at once)
    "screen": "TEXT",  # JSON: the screen before the launch, as the job wrote it (NULL: none read)
    # How it ended (injob/ends.py), once it ended: the class, the node it points at, the evidence.
    "end_class": "TEXT NOT NULL DEFAULT ''",
    "end_node": "TEXT NOT NULL DEFAULT ''",
    "end_evidence": "TEXT NOT NULL DEFAULT ''",
}
# What a database of mmm-orch 0.1.0 (before APPLICATION_ID) holds at least, and at most.
_FIRST_JOB_COLUMNS = {
    "id",
    "machine",
    "host",
    "scheduler",
    "commands",
    "workload",
    "name",
    "nodes",
    "ranks",
    "native_id",
    "job_dir",
    "script_path",
    "script",
    "plan",
    "submit_dir",
    "git_commit",
    "log_path",
    "state",
    "native_state",
    "reason",
    "exit_code",
    "signal",
    "submitted_at",
    "started_at",
    "ended_at",
    "checked_at",
}
_EVENT_COLUMNS = {"job_id", "at", "state", "native_state", "reason"}
_OUR_TABLES = {"jobs", "events", "bad_nodes", "groups", "group_plans", "leases"}
_SPECIAL_FILES = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class DatabaseError(MmmError):
    """The job database cannot be used as it is; nothing was written."""


def jobs_root_for(db_file: Path) -> Path:
    """Per-job directories (script copy, log, record.json, local supervisor files) beside the db."""
    return db_file.parent / "jobs"


def backup_path(db_file: Path) -> Path:
    return db_file.with_name(db_file.name + ".backup")


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
        return by_version(version)
    if app != 0:
        return "foreign", f"an SQLite database of another program (application id {app:#x})"
    try:  # immutable: reads only, and never leaves -wal or -shm files beside a foreign database
        conn = sqlite3.connect(f"{file.absolute().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            return by_tables(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return "foreign", f"an SQLite file that cannot be read ({exc})"


def by_version(version: int) -> tuple[str, str]:
    if version > SCHEMA_VERSION:
        return "newer", (
            f"a job database of a newer mmm-orch (schema {version}; this one knows "
            f"up to {SCHEMA_VERSION})"
        )
    return "mmm-orch", ""


def by_tables(conn: sqlite3.Connection) -> tuple[str, str]:
    """A database without mmm-orch's mark: one of an earlier mmm-orch has its tables, only them."""
    tables = {
        row[0]
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if not row[0].startswith("sqlite_")
    }
    if not tables:
        return "foreign", "an SQLite database with no tables that mmm-orch did not create"

    def columns(table: str) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}

    if not (
        {"jobs", "events"} <= tables <= _OUR_TABLES
        and columns("jobs") >= _FIRST_JOB_COLUMNS
        and columns("events") >= _EVENT_COLUMNS
    ):
        shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        return "foreign", f"an SQLite database of another program (tables: {shown})"
    return by_version(conn.execute("PRAGMA user_version").fetchone()[0])


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
        raise DatabaseError(
            f"job database {file} is {what}; it was left as it is: use that newer "
            "mmm-orch, or name another file with --db"
        )
    if kind == "empty" and (evidence := earlier_records(file)):
        raise DatabaseError(
            f"job database {file} is empty (0 bytes) but {evidence}: it was truncated. "
            f"Nothing was written; `mmm-orch db recover` rebuilds it from the backup and "
            f"the job directories (the empty file is kept aside)"
        )
    lost = len(recorded_job_dirs(file)) if held_jobs(file) else 0
    raise DatabaseError(
        f"job database {file} is {what}, not an mmm-orch job database; it was left as it is. "
        + (
            f"It lacks the {lost} jobs recorded in {jobs_root_for(file)}: if it replaced the job "
            "database, `mmm-orch db recover` sets it aside unchanged and rebuilds the database"
            if lost
            else ALLOWED
        )
    )


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
    return {
        r["job_dir"]
        for r in job_records(jobs_root_for(file))
        if isinstance(r, dict) and isinstance(r.get("job_dir"), str)
    }


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


MARK_WIDTH = 20  # digits: every mark has the same length, so one write replaces the last whole


def write_mark(db_file: Path, job_id: int) -> None:
    """Overwritten in place by one write of a fixed width: no rename, which on ext4 flushes the
    file's data first and costs a submit milliseconds when the disk is busy. A process killed
    mid-call leaves the old mark or the new one; a reader that catches a write half done reads a
    number that refuse_lost_jobs only believes with job directories to show for it. A mark that
    cannot be written only weakens the check, it fails nothing."""
    text = f"{job_id:0{MARK_WIDTH}d}\n".encode()
    try:
        fd = os.open(mark_path(db_file), os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, text)
        os.ftruncate(fd, len(text))  # a longer mark of another program's making: its tail
    except OSError:
        pass
    finally:
        os.close(fd)


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
        where = f"job database {file} " + (
            "is missing" if last_id == 0 and not file.exists() else "was replaced or rolled back"
        )
        raise DatabaseError(
            f"{where}: it lacks {lost} of the jobs recorded in {jobs_root_for(file)} (its jobs "
            f"reached id {mark}). Nothing was written; `mmm-orch db recover` rebuilds it from its "
            f"backup and the job directories (the current file is kept aside)"
        )


def create_file(file: Path) -> None:
    """A new job database at `file`, marked as mmm-orch's. Built aside and linked into place, so
    that no process ever sees it half made: an empty file at `file` is never one of ours."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise DatabaseError(
            f"job database {file}: cannot create {file.parent}: {exc.strerror}"
        ) from None
    tmp = file.with_name(f".{file.name}.{os.getpid()}.new")
    try:
        tmp.unlink(missing_ok=True)  # left by a killed process of the same pid
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("BEGIN")
            build(conn)
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):  # another mmm-orch made it meanwhile: use that
            os.link(tmp, file)
    except sqlite3.Error as exc:
        raise DatabaseError(f"job database {file}: cannot create: {describe(exc)}") from None
    except OSError as exc:
        reasons: dict[int | None, str] = {
            errno.ENOSPC: "the disk is full",  # (errno may be None)
            errno.EROFS: "cannot write there (read-only place)",
            errno.EACCES: "cannot write there (no permission)",
        }
        reason = reasons.get(exc.errno, exc.strerror)
        raise DatabaseError(f"job database {file}: cannot create: {reason}") from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def build(conn: sqlite3.Connection) -> None:
    """Create what is missing (tables, indexes, columns added since: all have defaults) and mark
    the file as mmm-orch's, of this schema version."""
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    for name, kind in _ADDED_COLUMNS.items():
        if name not in have:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
    if "account" not in have and "plan" in have:
        _price_earlier_jobs(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _price_earlier_jobs(conn: sqlite3.Connection) -> None:
    """Schema 5 on jobs recorded before it: the account from each plan, and for those that
    ended, a charge from the times and nodes on record (their plans hold no charging rules:
    plain node-hours)."""
    ended = {state.value for state in TERMINAL}
    rows = conn.execute(
        "SELECT id, plan, state, nodes, spares, started_at, ended_at FROM jobs"
    ).fetchall()
    for job_id, plan, state, nodes, spares, started, finished in rows:
        try:
            account = section(json.loads(plan), "queue").get("account") or ""
        except (ValueError, AttributeError):
            account = ""
        charged = (
            ended_charge(plan, nodes + (spares or 0), None, None, started, finished or started or 0)
            if state in ended
            else (None, None, None)
        )
        conn.execute(
            "UPDATE jobs SET account = ?, charged_nodes = ?, charged_seconds = ?, "
            "charge = ? WHERE id = ?",
            (str(account), *charged, job_id),
        )


def describe(exc: sqlite3.Error) -> str:
    """One line for an SQLite failure: what it means for the user."""
    text = str(exc)
    if "disk is full" in text or "disk I/O error" in text:
        return f"the disk is full or failing ({text})"
    if "readonly" in text or "unable to open" in text or "access permission" in text:
        return f"cannot write there (read-only place or no permission: {text})"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return (
            f"the database is damaged ({text}); `mmm-orch db check` says more and "
            "`mmm-orch db recover` rebuilds it from its backup and the job directories"
        )
    if "locked" in text or "busy" in text:
        return f"another mmm-orch holds it for too long ({text}); try again"
    return text
