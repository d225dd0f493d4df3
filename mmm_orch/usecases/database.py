"""The use cases that look after the job database itself: check it, back it up, rebuild it from
what can still be read (`mmm-orch db`), and the nodes it remembers as bad (`mmm-orch nodes`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.records import recover as rebuild
from mmm_orch.records.bad_nodes import bad_node_days
from mmm_orch.records.db import db_path, open_db
from mmm_orch.records.dbfile import DatabaseError
from mmm_orch.usecases.following import check_known


def check(path: str | None) -> list[str]:
    """What the check found, a line each (`needs_recovery` says whether that is an error)."""
    return rebuild.check(db_path(path))


def needs_recovery(path: str | None, lines: list[str]) -> DatabaseError | None:
    """The error for a check whose finding is that the database cannot be used as it is."""
    if "NEEDS RECOVERY" not in lines[0]:
        return None
    return DatabaseError(f"job database {db_path(path)} needs recovery: run `mmm-orch db recover`")


def backup(path: str | None) -> Path:
    db = open_db(path)
    if db is None:
        raise MmmError("no job database yet: nothing to back up")
    return db.backup()


def recover(path: str | None) -> tuple[Path, Path | None, rebuild.Report]:
    """The database at `path` rebuilt; where the old file was kept, and where the jobs came from."""
    where = db_path(path)
    moved, report = rebuild.recover(where)
    return where, moved, report


def bad_nodes(path: str | None, machine: str | None) -> list[dict[str, Any]]:
    """The nodes remembered as bad (of `machine`), newest first, unexpired."""
    db = open_db(path)
    check_known("machines", machine, db)
    return db.bad_nodes.rows(machine) if db is not None else []


def bad_node_expiry_days() -> float:
    return bad_node_days()


def forget_node(path: str | None, node: str, machine: str | None) -> int:
    """Forget `node` (on `machine`, else everywhere); on how many machines it was remembered."""
    db = open_db(path)
    gone = db.bad_nodes.forget(node, machine) if db is not None else 0
    if not gone:
        raise MmmError(
            f"node {node!r} is not remembered as bad" + (f" on {machine}" if machine else "")
        )
    return gone
