"""A job's record as the job database holds it, read from a row whose JSON and state are
checked (a database changed by hand is said to be damaged, never half read)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import field, fields
from typing import Any

from mmm_orch.dataclass_code import dataclass
from mmm_orch.records.dbfile import DatabaseError
from mmm_orch.schedulers.states import JobState

# The group_index of a pack's own job in its sweep, and of a held allocation's in its group (the
# points, and the runs sent into it, are numbered from 1).
PACK_INDEX = 0
ALLOCATION = "allocation"  # the group kind of a held allocation: its job and the runs sent into it


@dataclass(frozen=True)
class JobRecord:
    id: int
    machine: str
    host: str
    remote: str
    scheduler: str
    commands: dict[str, str]
    workload: str
    name: str
    nodes: int
    ranks: int
    native_id: str
    job_dir: str
    script_path: str
    submit_dir: str
    git_commit: str | None
    log_path: str
    state: JobState
    native_state: str
    reason: str
    exit_code: int | None
    signal: int | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    checked_at: float
    tag: str = ""
    submitter: str = ""
    run_dir: str = ""
    group_id: int | None = None
    group_index: int | None = None
    rerun_of: int | None = None
    spares: int = 0
    account: str = ""
    charged_nodes: int | None = None
    charged_seconds: float | None = None
    charge: float | None = None  # in the machine's unit, once the job ended
    waited_since: float | None = None  # when it entered the backlog (None: submitted at once)
    # The screen before its launch, as the job wrote it (injob/files.ScreenResult): each node's
    # figures, what it cost and what it did; None before it is read, or without one.
    screen: dict[str, Any] | None = None
    # How it ended (injob/ends.py): its end class, the node that points at and the evidence; ''
    # before it ended (and for jobs that ended before mmm-orch told them apart).
    end_class: str = ""
    end_node: str = ""
    end_evidence: str = ""
    # Only get() fills these; listings leave them out to stay fast with thousands of jobs.
    script: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def elapsed(self, now: float | None = None) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or now or time.time()) - self.started_at

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["state"] = self.state.value
        if not full:
            for key in ("script", "plan", "events", "commands", "submitter"):
                data.pop(key)
        return data


# A listing's columns: all but the large ones, which only get() reads.
LIST_COLUMNS = ", ".join(
    f.name for f in fields(JobRecord) if f.name not in ("script", "plan", "events")
)


def from_row(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data["commands"] = stored_json(data["commands"], dict, f"job {data['id']}'s scheduler commands")
    if "plan" in data:
        data["plan"] = stored_json(data["plan"], dict, f"job {data['id']}'s plan")
    if data.get("screen") is not None:
        data["screen"] = stored_json(data["screen"], dict, f"job {data['id']}'s screen")
    try:
        data["state"] = JobState(data["state"])
    except ValueError:
        raise DatabaseError(
            f"job {data['id']}'s state {str(data['state'])[:40]!r} is not one "
            "mmm-orch writes: the job database was changed by hand; "
            "`mmm-orch db check` says more"
        ) from None
    return JobRecord(**data)


def stored_json(text: Any, kind: type, what: str) -> Any:
    """A JSON column as written by mmm-orch, or one line saying it was damaged."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        value = None
    if not isinstance(value, kind):
        raise DatabaseError(
            f"{what} in the job database is damaged (not the JSON {kind.__name__} "
            "mmm-orch writes): it was changed by hand; `mmm-orch db check` says "
            "more"
        )
    return value
