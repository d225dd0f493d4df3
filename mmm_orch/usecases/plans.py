"""Plan a request for review (`mmm-orch plan`, `render`, `--dry-run`): the plan, with the nodes
remembered as bad avoided and the user's jobs counted where its queue has job limits, and the
script it would submit: neither writes or sends anything. Also the workload's options, a
script saved whole (`render --out`) and the retry settings checked before anything runs."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmm_orch.config.registry import load_workload
from mmm_orch.hosts.transport import Retry
from mmm_orch.paths import write_whole
from mmm_orch.planning import Plan, Request, resolve
from mmm_orch.planning.occupancy import QueueLoad
from mmm_orch.records.db import open_db
from mmm_orch.rendering import render

# A submission's own modules are imported in the functions that use them: `mmm-orch render`
# plans through here, and psutil and those modules would add ~20 ms to its start.


def bad_nodes(db: str | None, machine: str) -> tuple[str, ...]:
    """The machine's nodes mmm-orch remembers as bad (failover retired them, or diagnose blamed
    them), unexpired; read without creating the database."""
    opened = open_db(db)
    return tuple(opened.bad_nodes.of(machine)) if opened is not None else ()


def avoiding(planned: Plan, avoid: tuple[str, ...]) -> Plan:
    """A recorded plan kept away from `avoid` (the nodes remembered as bad now), as a new plan of
    the machine would be: its exclusion directive and its failover's nodes to take last."""
    from mmm_orch.config.registry import load_machine
    from mmm_orch.planning.launch_layout import placement

    request = Request(
        planned.machine,
        planned.workload,
        spare_nodes=planned.placement.spare_nodes,
        avoid_nodes=avoid,
    )
    again = placement(load_machine(planned.machine), request, planned.layout.nodes)
    return dataclasses.replace(planned, placement=again)


def plan(request: Request, db: str | None = None, remote: str | None = None) -> Plan:
    """The plan for `request`, avoiding the nodes remembered as bad in the database `db`. Where
    the queue it takes has job limits, the user's jobs there are counted (submission/queue_load.py:
    from the scheduler on `remote`, '' here; None: a review, offline) and a full queue skipped."""
    return counted_plan(request, db, remote)[0]


def counted_plan(
    request: Request, db: str | None, remote: str | None
) -> tuple[Plan, QueueLoad | None]:
    """The plan, and the user's jobs counted for it (None: its queue has no job limits)."""
    from mmm_orch.planning.verification import where_wanted
    from mmm_orch.submission import queue_load

    request = dataclasses.replace(request, avoid_nodes=bad_nodes(db, request.machine))
    planned = resolve(request)
    if request.queue_load is not None or not queue_load.limits_apply(planned):
        return where_wanted(planned, request.verify), request.queue_load
    load = queue_load.read(planned, remote, open_db(db))
    again = resolve(dataclasses.replace(request, queue_load=load))
    return where_wanted(again, request.verify), load


def script(request: Request, db: str | None = None, template: str | None = None) -> str:
    """The job script `request` would submit (for review: nothing is written or sent)."""
    return render(plan(request, db), template)


def options_of(workload: str) -> dict[str, Any]:
    """Workload `workload`'s options, each with its type and allowed values."""
    return load_workload(workload).options


def check_settings() -> None:
    """Refuse a bad setting in the environment (MMM_ORCH_RETRY_*) before anything runs."""
    Retry.from_env("submit")


def save(path: str, script_text: str) -> None:
    """A rendered script written to `path` whole (an interrupted write leaves the old file)."""
    write_whole(path, script_text)
