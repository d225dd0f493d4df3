"""What was spent and what remains: `mmm-orch usage` (the records charged, records/usage.py, the
open jobs refreshed first) and `mmm-orch balance` (the facility's own tool, records/balance.py)."""

from __future__ import annotations

from typing import Any

from mmm_orch.errors import InvalidValue
from mmm_orch.records.db import JobDB


def balance(machine: str, account: str | None = None, host: str | None = None):
    """The project's allocations on `machine` and what remains, from the facility's tool."""
    from mmm_orch.records.balance import balance as ask  # its SSH and parsers: only this command

    return ask(machine, account, host)


def usage_dicts(rows: list[Any]) -> list[dict[str, Any]]:
    """`usage` rows as plain dicts (JSON, the Python API)."""
    from mmm_orch.records import usage as spending

    return spending.as_dicts(rows)


def usage_text(rows: list[Any], by: str | None) -> str:
    """`usage` rows as the table `mmm-orch usage` prints."""
    from mmm_orch.records import usage as spending

    return spending.text(rows, by)


def usage(
    db: JobDB | None,
    machine: str | None = None,
    account: str | None = None,
    since: str | None = None,
    by: str | None = None,
):
    """What was spent (records/usage.py): the open jobs refreshed first, so that those that ended
    meanwhile are charged; (rows, the refresh's warnings)."""
    from mmm_orch.progress.refresh import refresh
    from mmm_orch.records import usage as spending

    start = spending.parse_since(since)
    if by is not None and by not in spending.GROUPINGS:
        raise InvalidValue("--by", by, "one of " + ", ".join(spending.GROUPINGS))
    if db is None:
        if account is not None:
            raise InvalidValue(
                "--account", account, "an account jobs were charged to: none recorded yet"
            )
        return [], []
    if account is not None and account not in db.accounts():  # before asking any scheduler
        spending.usage(db, machine, account, start, by)
    outcome = refresh(db, db.list(open_only=True, machine=machine))
    return spending.usage(db, machine, account, start, by), outcome.warnings
