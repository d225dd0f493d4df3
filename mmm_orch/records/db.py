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
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, overload

from mmm_orch.errors import MmmError
from mmm_orch.paths import default_db_path
from mmm_orch.planning.cost import ended_charge
from mmm_orch.records.bad_nodes import BadNodes
from mmm_orch.records.dbfile import (
    ALLOWED,
    APPLICATION_ID,
    SCHEMA_VERSION,
    DatabaseError,
    backup_path,
    build,
    by_tables,
    by_version,
    check_file,
    create_file,
    describe,
    read_mark,
    refuse_lost_jobs,
    write_mark,
)
from mmm_orch.records.groups import Groups
from mmm_orch.records.record import LIST_COLUMNS, JobRecord, from_row
from mmm_orch.records.waiting import Backlog
from mmm_orch.schedulers.states import JobState, JobStatus, advance

BACKUP_EVERY = 600.0
CANCEL_SENT = "cancel sent by mmm-orch"  # the reason of the event that records a cancel request
_OPEN_STATES = tuple(s.value for s in JobState if not s.terminal)


def db_path(path: str | None = None) -> Path:
    """`path`, else $MMM_ORCH_DB, else $XDG_STATE_HOME/mmm-orch/jobs.db."""
    return Path(path) if path else default_db_path()


_open: dict[Path, JobDB] = {}
_connected: collections.Counter[Path] = collections.Counter()  # live connections per file


@overload
def open_db(path: str | None = None, *, create: Literal[True]) -> JobDB: ...
@overload
def open_db(path: str | None = None, create: bool = False) -> JobDB | None: ...
def open_db(path: str | None = None, create: bool = False) -> JobDB | None:
    """The checked job database; None when there is none yet and `create` is False (commands
    that only read never create one). One connection per file and process: SQLite's locks are
    POSIX locks, which any other open-and-close of the file in the same process would drop."""
    file = db_path(path)
    key = file.absolute()
    if key in _open:
        return _open[key]
    # Checked only when not already open here: reading it again would drop the locks.
    if not _connected[key] and check_file(file) == "missing":
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


class JobDB:
    def __init__(self, path: Path):
        """Open the job database at `path`, creating it where there is none; a file that is not
        an mmm-orch database is refused before anything is written to it."""
        self.path = path
        if not path.exists():
            create_file(path)
        with self.errors("open"):
            # mode=rw: never creates a file (a path removed since would be an empty, unmarked one)
            self.conn = sqlite3.connect(
                f"{path.absolute().as_uri()}?mode=rw",
                uri=True,
                timeout=60,
                isolation_level=None,
                check_same_thread=False,
            )  # the API: threads take turns
            _connected[path.absolute()] += 1
        self.bad_nodes = BadNodes(self)
        self.groups = Groups(self)
        self.backlog = Backlog(self)
        try:
            with self.errors("open"):
                self._prepare()
        except BaseException:
            self.close()
            raise

    def _prepare(self) -> None:
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA busy_timeout = 60000")
        app = self.conn.execute("PRAGMA application_id").fetchone()[0]
        kind, what = by_version(self.conn.execute("PRAGMA user_version").fetchone()[0])
        if app != APPLICATION_ID:
            kind, what = (
                ("foreign", f"an SQLite database of another program (application id {app:#x})")
                if app
                else by_tables(self.conn)
            )
        if kind != "mmm-orch":
            raise DatabaseError(
                f"job database {self.path} is {what}, not one this mmm-orch "
                f"can use; it was left as it is. {ALLOWED}"
            )
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        if (
            app != APPLICATION_ID
            or self.conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION
        ):
            with self.write():  # one of an earlier mmm-orch: upgraded, and marked as ours
                build(self.conn)

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
        with self.errors("read"):
            row = self.conn.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'"
            ).fetchone()
        return row[0] if row else 0

    def job_dirs(self) -> set[str]:
        with self.errors("read"):
            return {row[0] for row in self.conn.execute("SELECT job_dir FROM jobs")}

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise DatabaseError(
                f"job database {self.path}: cannot {doing}: {describe(exc)}"
            ) from None

    def close(self) -> None:
        self.conn.close()
        _connected[self.path.absolute()] -= 1

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): take the write lock up front."""
        with self.errors("write"):
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
        values = {
            **values,
            "commands": json.dumps(values["commands"]),
            "plan": json.dumps(values["plan"]),
            **({"screen": json.dumps(values["screen"])} if values.get("screen") else {}),
            "checked_at": now,
            "state": values.get("state", JobState.SUBMITTING.value),
        }
        columns = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self.write():
            cur = self.conn.execute(
                f"INSERT INTO jobs ({columns}) VALUES ({marks})", list(values.values())
            )
            assert cur.lastrowid is not None  # set by the INSERT just made
            job_id = cur.lastrowid
            self.conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (job_id, now, values["state"], "", "recorded before submission"),
            )
            write_mark(self.path, job_id)  # under the write lock: marks only ever rise
        self._refresh_backup()
        return job_id

    def accepted(self, job_id: int, native_id: str, note: str = "submitted") -> JobRecord | None:
        """The scheduler took the job under `native_id`: it is pending from now on. Returns the
        record so settled, read in the same transaction (no second one); None where it was no
        longer `submitting` (someone settled it first). UPDATE then SELECT, not RETURNING: the
        SQLite of many facilities' Pythons predates it (3.35)."""
        now = time.time()
        with self.write():
            settled = self.conn.execute(
                "UPDATE jobs SET native_id = ?, state = ?, checked_at = ? "
                "WHERE id = ? AND state = ?",
                (native_id, JobState.PENDING.value, now, job_id, JobState.SUBMITTING.value),
            ).rowcount
            if not settled:
                return None
            self.conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (job_id, now, JobState.PENDING.value, "", note),
            )
            row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            events = self._events(job_id)
        record = from_row(row)  # after COMMIT: a damaged row never undoes the settling
        record.events.extend(events)
        return record

    def cancel_sent(self, job_id: int) -> None:
        """mmm-orch asked the scheduler to cancel the job (an end it then calls a success, as PBS
        can after a server restart, is read as cancelled: see progress/refresh.py)."""
        with self.write():
            self.conn.execute(
                "INSERT INTO events SELECT id, ?, state, '', ? FROM jobs WHERE id = ?",
                (time.time(), CANCEL_SENT, job_id),
            )

    def cancels_sent(self, job_ids: list[int]) -> set[int]:
        """Which of `job_ids` mmm-orch asked the scheduler to cancel."""
        marks = ", ".join("?" for _ in job_ids)
        return {
            row[0]
            for row in self.conn.execute(
                f"SELECT DISTINCT job_id FROM events WHERE reason = ? AND job_id IN ({marks})",
                (CANCEL_SENT, *job_ids),
            )
        }

    def screened(self, job_id: int, screen: dict[str, Any]) -> None:
        """The screen before the job's launch, as the job wrote it (kept once read)."""
        with self.write():
            self.conn.execute(
                "UPDATE jobs SET screen = ? WHERE id = ? AND screen IS NULL",
                (json.dumps(screen), job_id),
            )

    def ended(self, job_id: int, end: Any) -> None:
        """How the job ended (injob/ends.End), as a refresh or a diagnosis classed it."""
        with self.write():
            self.conn.execute(
                "UPDATE jobs SET end_class = ?, end_node = ?, end_evidence = ? WHERE id = ?",
                (end.name, end.node, end.evidence[:400], job_id),
            )

    def note(self, job_id: int, reason: str) -> None:
        """Say why a record is as it is (e.g. a submission whose outcome is not known yet)."""
        with self.write():
            self.conn.execute("UPDATE jobs SET reason = ? WHERE id = ?", (reason, job_id))

    def delete(self, job_id: int) -> None:
        """Remove the record of a job the scheduler never took (rejected, or never asked)."""
        with self.write():
            self.conn.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
            self.conn.execute(
                "DELETE FROM jobs WHERE id = ? AND state = ?", (job_id, JobState.SUBMITTING.value)
            )

    def accounts(self) -> set[str]:
        """The accounts jobs were charged to ('' where the machine has none)."""
        with self.errors("read"):
            return {row[0] for row in self.conn.execute("SELECT DISTINCT account FROM jobs")}

    def apply(self, updates: dict[int, JobStatus], now: float | None = None) -> None:
        """Record what the scheduler said, in one transaction; states only move forward."""
        if not updates:
            return
        now = now or time.time()
        changes, events = [], []
        with self.write():
            rows = {
                row["id"]: row
                for row in self.conn.execute(
                    "SELECT id, state, native_state, reason, started_at, ended_at, nodes, spares, "
                    "scheduler "
                    f"FROM jobs WHERE id IN ({','.join('?' * len(updates))})",
                    list(updates),
                )
            }
            charges = []
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
                    charges.append(self._charged(job_id, row, status, started, ended))
                if new.terminal and current.terminal:
                    continue  # terminal records are final
                native = status.native_state or row["native_state"]
                reason = status.reason
                # A cancelled or timed-out job's "0" says nothing; a non-zero code or signal does.
                code = status.exit_code if new.terminal else None
                if new in (JobState.CANCELLED, JobState.TIMEOUT) and not code:
                    code = None
                changes.append(
                    (
                        new.value,
                        native,
                        reason,
                        code,
                        status.signal if new.terminal else None,
                        started,
                        ended,
                        now,
                        job_id,
                    )
                )
                if new is not current or native != row["native_state"] or reason != row["reason"]:
                    events.append((job_id, now, new.value, native, reason))
            self.conn.executemany(
                "UPDATE jobs SET state = ?, native_state = ?, reason = ?, exit_code = ?, "
                "signal = ?, started_at = ?, ended_at = ?, checked_at = ? WHERE id = ?",
                changes,
            )
            self.conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", events)
            self.conn.executemany(
                "UPDATE jobs SET charged_nodes = ?, charged_seconds = ?, charge = ? WHERE id = ?",
                charges,
            )

    def _charged(
        self, job_id: int, row: sqlite3.Row, status: JobStatus, started: float | None, ended: float
    ) -> tuple:
        """(nodes, seconds, charge, id) of a job that ended (planning/cost.py's `ended_charge`)."""
        plan = self.conn.execute("SELECT plan FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]
        return (
            *ended_charge(
                plan, row["nodes"] + row["spares"], status.nodes, status.elapsed, started, ended
            ),
            job_id,
        )

    # -- reads -------------------------------------------------------------------------------

    def get(self, job_id: int, events: bool = True) -> JobRecord | None:
        with self.errors("read"):
            row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            record = from_row(row)
            if events:
                record.events.extend(self._events(job_id))
        return record

    def get_existing(self, job_id: int, events: bool = True) -> JobRecord:
        """The record of a job this process recorded or listed; an error where it is gone
        meanwhile (another mmm-orch removed it)."""
        record = self.get(job_id, events)
        if record is None:
            raise MmmError(
                f"job {job_id}: its record is gone from {self.path} (another mmm-orch "
                "removed it meanwhile)"
            )
        return record

    def _events(self, job_id: int) -> list[dict[str, Any]]:
        return [
            dict(e)
            for e in self.conn.execute(
                "SELECT at, state, native_state, reason FROM events WHERE job_id = ? ORDER BY at",
                (job_id,),
            )
        ]

    def list(
        self,
        *,
        ids: Iterable[int] = (),
        open_only: bool = False,
        limit: int | None = None,
        machine: str | None = None,
        group_id: int | None = None,
        state: JobState | None = None,
    ) -> list[JobRecord]:
        where: list[str] = []
        args: list[int | str] = []
        if state is not None:
            where.append("state = ?")
            args.append(state.value)
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
        sql = f"SELECT {LIST_COLUMNS} FROM jobs" + (
            f" WHERE {' AND '.join(where)}" if where else ""
        )
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        with self.errors("read"):
            return [from_row(row) for row in self.conn.execute(sql, args)][::-1]

    def count(self) -> int:
        with self.errors("read"):
            return self.conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]

    def id_range(self) -> tuple[int, int] | None:
        """The lowest and highest job id recorded (ids of refused submissions are not reused)."""
        with self.errors("read"):
            low, high = self.conn.execute("SELECT MIN(id), MAX(id) FROM jobs").fetchone()
        return None if low is None else (low, high)

    def machines(self) -> set[str]:
        with self.errors("read"):
            return {row[0] for row in self.conn.execute("SELECT DISTINCT machine FROM jobs")}

    # -- safety copies -----------------------------------------------------------------------

    def _refresh_backup(self) -> None:
        """Copy the whole database to jobs.db.backup when the copy is older than BACKUP_EVERY.
        A failed backup never fails the write that triggered it."""
        target = backup_path(self.path)
        with contextlib.suppress(OSError):
            if time.time() - target.stat().st_mtime < BACKUP_EVERY:
                return
        with contextlib.suppress(sqlite3.Error, OSError):
            self._copy_to(target)

    def _copy_to(self, target: Path) -> None:
        """The whole database copied to `target` by SQLite's online backup, whole or not at all."""
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            copy = sqlite3.connect(tmp)
            try:
                self.conn.backup(copy)
            finally:
                copy.close()
            os.chmod(tmp, 0o600)
            tmp.replace(target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise

    def backup(self) -> Path:
        """jobs.db.backup written now, or DatabaseError (a directory there, a full disk)."""
        target = backup_path(self.path)
        try:
            self._copy_to(target)
        except OSError as exc:
            raise DatabaseError(f"backup {target}: not written: {exc.strerror or exc}") from None
        except sqlite3.Error as exc:
            raise DatabaseError(f"backup {target}: not written: {describe(exc)}") from None
        return target
