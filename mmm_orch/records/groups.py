"""Groups of jobs: a chain's links and a sweep's points (and a pack's own job), each group with
its kind and the spec it was made from. A table of the job database (`db.groups`), with its packs' plans in another."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from mmm_orch.records.access import Access
from mmm_orch.records.record import stored_json


class Groups:
    """The job database's groups and group_plans tables, through its connection and
    transactions."""

    def __init__(self, db: Access):
        self.db = db

    def new(self, kind: str, spec: dict[str, Any], plans: Sequence[dict[str, Any]] = ()) -> int:
        """A group and its spec; `plans`: a pack's points' plans, in a table of their own (a
        listing reads every group's spec, and a thousand plans are megabytes)."""
        with self.db.write():
            cur = self.db.conn.execute(
                "INSERT INTO groups (kind, created_at, spec) VALUES (?, ?, ?)",
                (kind, time.time(), json.dumps(spec)),
            )
            assert cur.lastrowid is not None  # set by the INSERT just made
            group_id = cur.lastrowid
            self.db.conn.executemany(
                "INSERT INTO group_plans (group_id, idx, plan) VALUES (?, ?, ?)",
                [(group_id, index, json.dumps(plan)) for index, plan in enumerate(plans, start=1)],
            )
            return group_id

    def plans(self, group_id: int) -> list[dict[str, Any]]:
        """A pack's points' plans, in point order (as new_group stored them)."""
        with self.db.errors("read"):
            rows = self.db.conn.execute(
                "SELECT idx, plan FROM group_plans WHERE group_id = ? ORDER BY idx", (group_id,)
            ).fetchall()
        return [stored_json(plan, dict, f"group {group_id}'s plan {index}") for index, plan in rows]

    def delete_empty(self, group_id: int) -> None:
        """Remove a group that no job was recorded in (its first submission was refused)."""
        with self.db.write():
            if self.db.conn.execute(
                "DELETE FROM groups WHERE id = ? AND NOT EXISTS (SELECT 1 FROM "
                "jobs WHERE group_id = ?)",
                (group_id, group_id),
            ).rowcount:
                self.db.conn.execute("DELETE FROM group_plans WHERE group_id = ?", (group_id,))

    def kinds(self) -> dict[int, str]:
        """Every chain's and sweep's id and kind."""
        with self.db.errors("read"):
            return {row[0]: row[1] for row in self.db.conn.execute("SELECT id, kind FROM groups")}

    def of_kind(self, kind: str) -> set[int]:
        """The ids of the groups of one kind."""
        with self.db.errors("read"):
            rows = self.db.conn.execute("SELECT id FROM groups WHERE kind = ?", (kind,))
            return {row[0] for row in rows}

    def get(self, group_id: int) -> dict[str, Any] | None:
        with self.db.errors("read"):
            row = self.db.conn.execute("SELECT * FROM groups WHERE id = ?", (group_id,)).fetchone()
        if row is None:
            return None
        return {**dict(row), "spec": stored_json(row["spec"], dict, f"group {group_id}'s spec")}
