"""A project's allocation and what remains of it, from the facility's own tool (the profile's
`charging.balance`: ALCF's sbank, OLCF's showusage), run here or on a login node over SSH as
`status` reaches the scheduler. The parsers are pure functions, tested on the outputs the
facilities' documentation records. A tool that is missing, slow or failing is a note, never an
error: nothing else waits for it (submission never asks it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mmm_orch.config.registry import load_machine
from mmm_orch.errors import InvalidValue, MmmError, shown
from mmm_orch.hosts import host_for
from mmm_orch.planning.checks import SAFE_WORD


@dataclass(frozen=True)
class Allocation:
    project: str
    resource: str  # the machine as the tool names it ('' where it names none)
    allocation: float | None  # awarded, in node-hours
    used: float
    remaining: float
    jobs: int | None = None
    start: str = ""
    end: str = ""


@dataclass(frozen=True)
class Balance:
    machine: str
    account: str
    allocations: list[Allocation]
    note: str = ""  # why there is none: no tool, it failed, it timed out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "allocations": [asdict(a) for a in self.allocations]}


# A number as the tools print them ("1,084,770.3"), in ASCII digits: `\d` would take any
# script's. No allocation has more node-hours or jobs than 15 digits hold (a float holds them
# exactly).
_NUMBER = re.compile(r"-?[0-9][0-9,]*(\.[0-9]+)?")
MOST_DIGITS = 15


def _number(text: str, field: str) -> float:
    """`text` as a number; ValueError naming `field` and the text where it is not one a tool
    can mean (a 5,000-digit count is one int() refuses, and a float reads as infinity)."""
    digits = text.replace(",", "").lstrip("-").partition(".")[0]
    if not _NUMBER.fullmatch(text) or len(digits) > MOST_DIGITS:
        raise ValueError(f"{field} {shown(text)}")
    return float(text.replace(",", ""))


# sbank-list-allocations: " Id  Start  End  Resource  Project  Jobs  Charged  Available Balance"
# (fields added with -f "+created" follow the balance).
_SBANK_ROW = re.compile(
    r"^\s*[0-9]+\s+([0-9]{4}-[0-9]{2}-[0-9]{2})\s+([0-9]{4}-[0-9]{2}-[0-9]{2})\s+(\S+)\s+(\S+)\s+"
    r"([0-9,]+)\s+(-?[0-9,.]+)\s+(-?[0-9,.]+)(\s.*)?$"
)


def parse_sbank(text: str) -> list[Allocation]:
    """`sbank-list-allocations -p PROJECT -r RESOURCE` (ALCF): one row per allocation, in node
    hours; the Totals block below the rows repeats them and is not read. ValueError naming the
    field of a row whose number cannot be read."""
    out = []
    for line in text.splitlines():
        if match := _SBANK_ROW.match(line):
            start, end, resource, project, jobs, charged, available, _ = match.groups()
            used = _number(charged, "charged node-hours")
            remaining = _number(available, "available node-hours")
            out.append(
                Allocation(
                    project=project,
                    resource=resource,
                    allocation=used + remaining,
                    used=used,
                    remaining=remaining,
                    jobs=round(_number(jobs, "jobs")),
                    start=start,
                    end=end,
                )
            )
    return out


def parse_showusage(text: str) -> list[Allocation]:
    """`showusage` (OLCF): `project | allocation | usage | remaining | usage`, node-hours since
    January 1 up to the previous midnight. The two columns headed "Usage" are read by position:
    the project's (third), then, per OLCF's guide, the user's own [?] (not read). ValueError
    naming the field of a row whose number cannot be read."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not cells[0] or set(cells[0]) <= {"_", " "}:
            continue
        if not _NUMBER.fullmatch(cells[1]):
            continue  # the header
        allocation, used, remaining = (
            _number(cell, f"{field} node-hours")
            for cell, field in zip(cells[1:4], ("allocation", "usage", "remaining"), strict=True)
        )
        out.append(
            Allocation(
                project=cells[0], resource="", allocation=allocation, used=used, remaining=remaining
            )
        )
    return out


PARSERS: dict[str, Callable[[str], list[Allocation]]] = {
    "sbank": parse_sbank,
    "showusage": parse_showusage,
}


def balance(machine_name: str, account: str | None, host: str | None = None) -> Balance:
    """The allocations of `account` (the profile's default where None) the machine's tool
    reports; where it cannot tell, a Balance with no allocations and a note saying why."""
    machine = load_machine(machine_name)
    tool = machine.charging.balance
    account = account or machine.account.default
    if account and not SAFE_WORD.fullmatch(account):
        raise InvalidValue("--account", account, "letters, digits, '_', '.', '-'")

    def none(why: str) -> Balance:
        return Balance(machine.name, account or "", [], why)

    if tool is None:
        return none(
            f"machine {machine.name} has no balance tool in its profile"
            + (f" ({machine.charging.notes})" if machine.charging.notes else "")
        )
    if "{account}" in " ".join(tool.command) and not account:
        raise MmmError(f"balance on {machine.name}: give the project to ask about (--account)")
    argv = [word.format(account=account) for word in tool.command]
    remote = (
        host
        if host is not None
        else (
            "" if shutil.which(argv[0]) else (machine.login_hosts[0] if machine.login_hosts else "")
        )
    )
    where = f" on {remote}" if remote else ""
    runner = host_for(remote)  # a bad --host is an error (exit 2), not a note
    try:
        result = runner.run(argv, timeout=tool.timeout_s)
    except subprocess.TimeoutExpired:
        return none(f"{argv[0]}{where} did not answer within {tool.timeout_s:g} s")
    except (MmmError, OSError) as exc:
        return none(f"{argv[0]}{where}: {exc}")
    if result.returncode != 0:
        return none(
            f"{argv[0]}{where} failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[:200]}"
        )
    try:
        listed = PARSERS[tool.parser](result.stdout)
    except ValueError as exc:  # a tool whose numbers cannot be what it means is one failing
        return none(
            f"{argv[0]}{where} printed {exc}, which is not a number mmm-orch reads (ASCII "
            f"digits, at most {MOST_DIGITS} before the point)"
        )
    found = [a for a in listed if not account or a.project == account]
    if found:
        return Balance(machine.name, account or "", found)
    return none(
        f"{argv[0]}{where} listed no allocation"
        + (
            f" of {account} (it listed: {', '.join(sorted({a.project for a in listed}))})"
            if listed
            else ""
        )
    )
