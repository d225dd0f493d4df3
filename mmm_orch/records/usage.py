"""What was spent: the charges the job database recorded as jobs ended (the scheduler's nodes and
elapsed time, priced by the plan's rules), summed by machine and account and, on request, by
workload, sweep, chain or day; and the budgets of the user's configuration that spending counts
against (budgets.yaml beside the user's machine profiles)."""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmm_orch.config.registry import load_machine
from mmm_orch.errors import ConfigError, InvalidValue, MmmError
from mmm_orch.limits import MAX_EPOCH, MAX_INT
from mmm_orch.planning.checks import bounded
from mmm_orch.planning.cost import MAX_NODE_HOURS, hours, most_of
from mmm_orch.planning.model import Plan
from mmm_orch.records.db import JobDB
from mmm_orch.records.dbfile import DatabaseError
from mmm_orch.records.record import ALLOCATION, PACK_INDEX, JobRecord

GROUPINGS = ("workload", "sweep", "chain", "day")
BUDGETS_FILE = "budgets.yaml"


@dataclass
class UsageRow:
    machine: str
    account: str
    group: str  # the --by value ('' without --by)
    jobs: int  # ended, and charged
    node_hours: float  # nodes x elapsed, as the scheduler accounted them
    charged: float  # in the machine's unit (node_hours x the charge factors)
    unit: str
    open: int  # jobs not ended yet: charged once they end


def parse_since(text: str | None) -> float | None:
    """--since: a date (YYYY-MM-DD, from its midnight here) or a date and time (ISO 8601)."""
    if text is None:
        return None
    try:
        # fromisoformat alone also takes ISO's basic forms: 30 digits read as a date and time.
        if not _SINCE.fullmatch(text.strip()):
            raise ValueError(text)
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise InvalidValue(
            "--since", text, "a date, YYYY-MM-DD, or a date and time, YYYY-MM-DDTHH:MM"
        ) from None


_SINCE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2})?)?")


# A record's times: the local date of MAX_EPOCH's last day can be in year 10000 east of UTC.
_LATEST = MAX_EPOCH - 86400
# The numbers of a record that usage and budgets read: name, least, most, whole, may be None,
# what is allowed.
_TIME = "seconds since 1970, before the year 9999"
_NUMBERS = (
    ("submitted_at", 0, _LATEST, False, False, _TIME),
    ("ended_at", 0, _LATEST, False, True, _TIME),
    ("nodes", 0, MAX_INT, True, False, "a whole number >= 0"),
    ("spares", 0, MAX_INT, True, False, "a whole number >= 0"),
    ("charged_nodes", 0, MAX_INT, True, True, "a whole number >= 0"),
    ("charged_seconds", 0, _LATEST, False, True, "a number of seconds >= 0"),
    ("charge", 0, MAX_NODE_HOURS, False, True, f"a number from 0 to {MAX_NODE_HOURS:g}"),
)


def checked(record: JobRecord) -> JobRecord:
    """`record` once each number usage and budgets read from it is one mmm-orch writes. One that
    is not (the database was changed by hand) is refused, not skipped: a sum that leaves a job
    out is wrong, and a budget that cannot count a job's charge cannot be kept."""
    for name, least, most, whole, optional, allowed in _NUMBERS:
        value = getattr(record, name)
        if value is None and optional:
            continue
        try:
            bounded(f"job {record.id}'s {name}", value, least, most, allowed, whole)
        except InvalidValue as exc:
            raise DatabaseError(
                f"{exc}; the job database was changed by hand (mmm-orch writes "
                "no such value): set it right with sqlite3"
            ) from None
    return record


def _group(record: JobRecord, by: str | None, kinds: dict[int, str]) -> str:
    if by == "workload":
        return record.workload
    if by == "day":
        return dt.datetime.fromtimestamp(record.ended_at or record.submitted_at).strftime(
            "%Y-%m-%d"
        )
    if by in ("sweep", "chain"):
        if record.group_id is not None and kinds.get(record.group_id) == by:
            return f"{'s' if by == 'sweep' else 'chain '}{record.group_id}"
        return "-"
    return ""


def usage(
    db: JobDB,
    machine: str | None = None,
    account: str | None = None,
    since: float | None = None,
    by: str | None = None,
) -> list[UsageRow]:
    """The rows of `mmm-orch usage`, from the records as last refreshed."""
    if by is not None and by not in GROUPINGS:
        raise InvalidValue("--by", by, "one of " + ", ".join(GROUPINGS))
    records = [
        checked(r)
        for r in db.list()
        if (machine is None or r.machine == machine) and (account is None or r.account == account)
    ]
    if account is not None and not records and account not in db.accounts():
        known = sorted(db.accounts())
        raise InvalidValue(
            "--account",
            account,
            "an account jobs were charged to: "
            + (", ".join(a or "(none)" for a in known) if known else "none recorded yet"),
        )
    kinds = {group_id: kind for group_id, kind in db.groups.kinds().items()}
    # A pack's points, and the runs sent into a held allocation, ran in its job, which is
    # charged: their shares are not counted again.
    packs = {
        r.group_id
        for r in records
        if r.group_index == PACK_INDEX
        and r.group_id is not None
        and kinds.get(r.group_id) in ("sweep", ALLOCATION)
    }
    rows: dict[tuple[str, str, str], UsageRow] = {}
    for record in records:
        if record.group_id in packs and record.group_index != PACK_INDEX:
            continue
        if since is not None and _when(record) < since:
            continue
        key = (record.machine, record.account, _group(record, by, kinds))
        row = rows.setdefault(
            key, UsageRow(*key, jobs=0, node_hours=0.0, charged=0.0, unit=_unit(record), open=0)
        )
        if record.charge is None:
            row.open += not record.terminal
            continue
        row.jobs += 1
        row.node_hours += (record.charged_nodes or 0) * (record.charged_seconds or 0) / 3600
        row.charged += record.charge
    return sorted(rows.values(), key=lambda r: (r.machine, r.account, r.group))


def _when(record: JobRecord) -> float:
    """When a job's charge counts: when it ended (an open job: when it was submitted)."""
    return record.ended_at or record.submitted_at


def _unit(record: JobRecord) -> str:
    try:
        return load_machine(record.machine).charging.unit
    except MmmError:  # a profile since removed
        return "node-hours"


def as_dicts(rows: list[UsageRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def text(rows: list[UsageRow], by: str | None) -> str:
    head = [
        "MACHINE",
        "ACCOUNT",
        *([by.upper()] if by else []),
        "JOBS",
        "NODE-HOURS",
        "CHARGED",
        "UNIT",
        "OPEN",
    ]
    cells = [head] + [
        [
            r.machine,
            r.account or "-",
            *([r.group] if by else []),
            str(r.jobs),
            hours(r.node_hours),
            hours(r.charged),
            r.unit,
            str(r.open or ""),
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(head))]
    out = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    units = {r.unit for r in rows}
    if len(rows) > 1 and len(units) == 1:
        out.append(
            f"total: {sum(r.jobs for r in rows)} jobs, {hours(sum(r.charged for r in rows))} "
            f"{units.pop()}"
        )
    return "\n".join(out) + "\n"


# -- budgets -----------------------------------------------------------------------------------


def budgets_file() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "mmm-orch" / BUDGETS_FILE


def account_budget(account: str | None, machine: str) -> tuple[float, float | None, bool] | None:
    """(node-hours, since, whether it holds for every machine) the user's budgets.yaml gives
    `account` on `machine` (an entry without `machine` holds for all, counted together), or
    None. Every entry is checked, not only the one that applies."""
    path = budgets_file()
    if not account or not path.is_file():
        return None
    # PyYAML costs ~12 ms at start-up, and the use cases (render's among them) import this module
    from mmm_orch.config.yamlio import load_yaml

    data = load_yaml(path).data or {}
    entries = data.get("budgets") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: budgets: a list of {{account, node_hours[, machine, since]}}")
    found = None
    for i, entry in enumerate(entries):
        where = f"{path}: budgets[{i}]"
        if (
            not isinstance(entry, dict)
            or set(entry) - {"account", "machine", "node_hours", "since"}
            or not isinstance(entry.get("account"), str)
            or not isinstance(entry.get("machine", ""), str)
        ):
            raise ConfigError(
                f"{where}: keys account (a name), node_hours, and machine (a name) "
                "and since (YYYY-MM-DD) if wanted"
            )
        amount = bounded(
            f"{where}.node_hours",
            entry.get("node_hours"),
            0,
            MAX_NODE_HOURS,
            f"a number >= 0, at most {MAX_NODE_HOURS:g}",
        )
        since = entry.get("since")
        try:
            start = parse_since(str(since)) if since is not None else None
        except InvalidValue:
            raise ConfigError(f"{where}.since {since!r} is invalid: YYYY-MM-DD") from None
        if (
            found is None
            and entry["account"] == account
            and entry.get("machine", machine) == machine
        ):
            found = float(amount), start, "machine" not in entry
    return found


def account_left(db: JobDB | None, plan: Plan) -> tuple[float, str] | None:
    """What the account's budget in budgets.yaml leaves for `plan`: its amount less the recorded
    charges of jobs that ended since its start (on its machine, or on all for a budget without
    one) and the most each open job can still be charged; with the numbers in words. None where
    the account has no budget."""
    budget = account_budget(plan.queue.account, plan.machine)
    if budget is None:
        return None
    amount, since, everywhere = budget
    spent = committed = 0.0
    records = [] if db is None else db.list(machine=None if everywhere else plan.machine)
    for record in records:
        if record.account != plan.queue.account:
            continue
        checked(record)
        if since and _when(record) < since:
            continue
        if record.charge is not None:
            spent += record.charge
        elif not record.terminal:
            assert db is not None  # there are records only when there is a database
            committed += _most(db.get(record.id, events=False) or record)
    left = max(0.0, amount - spent - committed)
    return left, (
        f"{hours(spent)} spent and up to {hours(committed)} held by open jobs leave "
        f"{hours(left)} of its budget of {hours(amount)} ({budgets_file()})"
    )


def check_account_budget(db: JobDB | None, plan: Plan, most: float, what: str) -> float | None:
    """Refuse `most` more over the account's budget; what the budget leaves (None: no budget)."""
    found = account_left(db, plan)
    if found is None:
        return None
    left, why = found
    if most > left:
        unit = plan.cost.unit if plan.cost else "node-hours"
        raise InvalidValue(
            "account",
            plan.queue.account,
            "a plan within its budget",
            f"account {plan.queue.account!r} on {plan.machine}: {what} can be "
            f"charged up to {hours(most)} {unit}; {why}",
        )
    return left


def _most(record: JobRecord) -> float:
    """The most an open job can still be charged: its plan's price (a record made before plans
    were priced: its nodes for an hour)."""
    return most_of(record.plan, float(record.nodes + record.spares))
