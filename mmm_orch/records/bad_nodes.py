"""Nodes remembered as bad, per machine: failover retires them and diagnose blames them (with
the log line as evidence); submissions keep them out until they expire or `mmm-orch nodes
forget` says they were repaired. A table of the job database (`db.bad_nodes`)."""

from __future__ import annotations

import os
import time
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.limits import NODE_NAME
from mmm_orch.records.access import Access

MAX_BAD_NODE_DAYS = 3650


def bad_node_days() -> float:
    """How long a blamed node stays avoided: $MMM_ORCH_BAD_NODE_DAYS, else 7 days."""
    text = os.environ.get("MMM_ORCH_BAD_NODE_DAYS", "7")
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not 0 <= days <= MAX_BAD_NODE_DAYS:  # also nan, inf and 1e308 (a date past year 9999)
        raise MmmError(
            f"MMM_ORCH_BAD_NODE_DAYS {text!r} is invalid: days, a number from 0 to "
            f"{MAX_BAD_NODE_DAYS}"
        )
    return days


class BadNodes:
    """The job database's bad_nodes table, through the database's connection and transactions."""

    def __init__(self, db: Access):
        self.db = db

    def blame(self, machine: str, node: str, evidence: str, job_id: int | None) -> None:
        """Remember `node` as bad on `machine`; the same job blaming it again changes nothing
        (its expiry runs from the first time). A name that is not a host name is not kept: it
        goes into later jobs' directives."""
        if not NODE_NAME.match(node):
            return
        with self.db.write():
            self.db.conn.execute(
                "INSERT INTO bad_nodes VALUES (?, ?, ?, ?, ?) ON CONFLICT (machine, node) DO UPDATE "
                "SET at = excluded.at, job_id = excluded.job_id, evidence = excluded.evidence "
                "WHERE bad_nodes.job_id IS NOT excluded.job_id",
                (machine, node, time.time(), job_id, evidence[:500]),
            )

    def rows(self, machine: str | None = None) -> list[dict[str, Any]]:
        """Unexpired entries (MMM_ORCH_BAD_NODE_DAYS, 7 by default), newest first."""
        since = time.time() - bad_node_days() * 86400
        sql = "SELECT * FROM bad_nodes WHERE at >= ?" + (" AND machine = ?" if machine else "")
        with self.db.errors("read"):
            rows = self.db.conn.execute(
                sql + " ORDER BY at DESC", (since, machine) if machine else (since,)
            )
            return [dict(row) for row in rows]

    def of(self, machine: str) -> list[str]:
        return sorted(row["node"] for row in self.rows(machine))

    def forget(self, node: str, machine: str | None = None) -> int:
        sql = "DELETE FROM bad_nodes WHERE node = ?" + (" AND machine = ?" if machine else "")
        with self.db.write():
            return self.db.conn.execute(sql, (node, machine) if machine else (node,)).rowcount
