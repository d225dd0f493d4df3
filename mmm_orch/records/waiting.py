"""The backlog in the job database (`db.backlog`): runs recorded `waiting` (`db.list(state=...)`
lists them, in the order they came), each taken out exactly once; and the lease that lets one
mover at a time submit them.

A run leaves the backlog by a compare-and-set in one write transaction: `claim` turns it from
`waiting` to `submitting` (the submit protocol of submission/submit.py from there on), `withdraw`
to `cancelled`; whoever comes second finds it no longer waiting. The lease is a row, not a file
lock: it holds wherever the database itself does (the SQLite file's locks), a mover on another
login node included, and a mover killed holding it is known by its process being gone (this
host) or by the lease running out (another host)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from mmm_orch.records.access import Access
from mmm_orch.schedulers.states import JobState

MOVER = "backlog mover"  # the lease's name


class Backlog:
    """The job database's waiting runs and the mover's lease, through its connection and
    transactions."""

    def __init__(self, db: Access):
        self.db = db

    def claim(
        self,
        job_id: int,
        submitter: str,
        reason: str = "submitted from the backlog",
        **columns: float | str,
    ) -> bool:
        """Take a waiting run out to submit it (`submitting`, by `submitter`, from now, with
        `columns` set: a held allocation's holder makes it its own); False where it is no
        longer waiting (submitted, started, withdrawn)."""
        return self._change(
            job_id,
            JobState.WAITING,
            JobState.SUBMITTING,
            reason,
            {"submitter": submitter, "submitted_at": time.time(), **columns},
        )

    def requeue(self, job_id: int, reason: str) -> bool:
        """Back into the backlog, in its place, a claimed run the scheduler never took (never a
        job submitted at once: it was in no backlog)."""
        return self._change(
            job_id, JobState.SUBMITTING, JobState.WAITING, reason, from_backlog=True
        )

    def withdraw(self, job_id: int, reason: str) -> bool:
        """A waiting run taken out unsubmitted (`cancelled`); False where it is no longer
        waiting."""
        return self._change(
            job_id, JobState.WAITING, JobState.CANCELLED, reason, {"ended_at": time.time()}
        )

    def refused(self, job_id: int, reason: str) -> bool:
        """A claimed run the scheduler refused in its own words: it failed, unsubmitted."""
        return self._change(
            job_id, JobState.SUBMITTING, JobState.FAILED, reason, {"ended_at": time.time()}
        )

    def _change(
        self,
        job_id: int,
        before: JobState,
        after: JobState,
        reason: str,
        columns: Mapping[str, float | str] | None = None,
        from_backlog: bool = False,
    ) -> bool:
        """`job_id` from state `before` to `after` with `columns` set, and an event saying
        `reason`, in one transaction; False where it was not in `before` (another was first)."""
        now = time.time()
        values = {"state": after.value, "reason": reason, "checked_at": now, **(columns or {})}
        sets = ", ".join(f"{column} = ?" for column in values)
        where = "id = ? AND state = ?" + (" AND waited_since IS NOT NULL" if from_backlog else "")
        with self.db.write():
            changed = self.db.conn.execute(
                f"UPDATE jobs SET {sets} WHERE {where}", [*values.values(), job_id, before.value]
            ).rowcount
            if changed:
                self.db.conn.execute(
                    "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                    (job_id, now, after.value, "", reason),
                )
        return bool(changed)

    def lease(self, holder: str, seconds: float, gone) -> bool:
        """The mover's lease for `seconds`, to `holder` (the submitter() text of this process):
        taken where free, run out, held by a process `gone(holder)` says has ended, or renewed
        where `holder` has it already; False where another mover holds it."""
        now = time.time()
        with self.db.write():
            row = self.db.conn.execute(
                "SELECT holder, until FROM leases WHERE name = ?", (MOVER,)
            ).fetchone()
            if row is not None and row[0] != holder and row[1] > now and not gone(row[0]):
                return False
            self.db.conn.execute(
                "INSERT OR REPLACE INTO leases (name, holder, until) VALUES (?, ?, ?)",
                (MOVER, holder, now + seconds),
            )
        return True

    def release(self, holder: str) -> None:
        with self.db.write():
            self.db.conn.execute(
                "DELETE FROM leases WHERE name = ? AND holder = ?", (MOVER, holder)
            )
