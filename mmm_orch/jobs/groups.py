"""Groups of jobs: a chain's links and a sweep's points (and a pack's own job), each group with
its kind and the spec it was made from. A part of the job database (JobDB), in its own table."""

from __future__ import annotations

import json
import time
from typing import Any

from mmm_orch.jobs.record import stored_json


class Groups:
    """JobDB's groups table (JobDB gives the connection and its write transaction)."""

    def new_group(self, kind: str, spec: dict[str, Any],
                  plans: list[dict[str, Any]] = ()) -> int:
        """A group and its spec; `plans`: a pack's points' plans, in a table of their own (a
        listing reads every group's spec, and a thousand plans are megabytes)."""
        with self._write():
            cur = self.conn.execute("INSERT INTO groups (kind, created_at, spec) VALUES (?, ?, ?)",
                                    (kind, time.time(), json.dumps(spec)))
            group_id = int(cur.lastrowid)
            self.conn.executemany("INSERT INTO group_plans (group_id, idx, plan) VALUES (?, ?, ?)",
                                  [(group_id, index, json.dumps(plan))
                                   for index, plan in enumerate(plans, start=1)])
            return group_id

    def group_plans(self, group_id: int) -> list[dict[str, Any]]:
        """A pack's points' plans, in point order (as new_group stored them)."""
        with self._errors("read"):
            rows = self.conn.execute("SELECT idx, plan FROM group_plans WHERE group_id = ? "
                                     "ORDER BY idx", (group_id,)).fetchall()
        return [stored_json(plan, dict, f"group {group_id}'s plan {index}") for index, plan in rows]

    def delete_empty_group(self, group_id: int) -> None:
        """Remove a group that no job was recorded in (its first submission was refused)."""
        with self._write():
            if self.conn.execute("DELETE FROM groups WHERE id = ? AND NOT EXISTS (SELECT 1 FROM "
                                 "jobs WHERE group_id = ?)", (group_id, group_id)).rowcount:
                self.conn.execute("DELETE FROM group_plans WHERE group_id = ?", (group_id,))

    def group_kinds(self) -> dict[int, str]:
        """Every chain's and sweep's id and kind."""
        with self._errors("read"):
            return {row[0]: row[1] for row in self.conn.execute("SELECT id, kind FROM groups")}

    def group(self, group_id: int) -> dict[str, Any] | None:
        with self._errors("read"):
            row = self.conn.execute("SELECT * FROM groups WHERE id = ?", (group_id,)).fetchone()
        if row is None:
            return None
        return {**dict(row), "spec": stored_json(row["spec"], dict, f"group {group_id}'s spec")}
