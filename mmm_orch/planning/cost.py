"""What a plan can cost before it is submitted, in the facility's unit (node-hours), and the
budgets that refuse it: the most one job, a sweep or a chain can be charged, and why.

The rules are the profile's (`charging:` in machines/*.yaml, each with its source): every node a
job holds is charged (nodes are allocated whole, so spares held for failover count like active
ones), for the time it ran (or the walltime it asked for, where a facility charges that), at
least the facility's minimum, times the machine's and the queue's charge factors.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from mmm_orch.config.machine import Machine
from mmm_orch.config.queues import Queue
from mmm_orch.errors import InvalidValue
from mmm_orch.limits import MAX_INT
from mmm_orch.planning.checks import bounded
from mmm_orch.planning.model import CostPlan, Plan
from mmm_orch.walltime import format_walltime

# A budget or a charge: a facility's whole year is about 10^8 node-hours.
MAX_NODE_HOURS = 1e12


def priced(
    machine: Machine,
    queue: Queue | None,
    nodes: int,
    spare_nodes: int,
    walltime: int,
    budget: float | None,
    share: float = 1.0,
) -> CostPlan:
    rules = machine.charging
    factor = rules.factor * (
        queue.charge_factor if queue and queue.charge_factor is not None else 1.0
    )
    return CostPlan(
        unit=rules.unit,
        nodes=nodes + spare_nodes if rules.whole_nodes else nodes,
        spare_nodes=spare_nodes,
        walltime=walltime,
        factor=factor,
        charged_for=rules.charged_for,
        minimum=rules.minimum or 0,
        source=rules.source,
        budget=budget,
        share=share,
    )


def ended_charge(
    plan_json: str,
    asked_nodes: int,
    nodes: int | None,
    elapsed: float | None,
    started: float | None,
    ended: float,
) -> tuple[int, float, float]:
    """(nodes, seconds, charge) of a job that ended: the nodes and time its scheduler accounted
    (where it says; else the nodes asked for, spares included, and the times on record), priced
    by the rules its recorded plan holds. A job that never started, or held its nodes no time,
    is charged nothing. A launch inside an allocation (recorded under the local executor, on a
    machine with a scheduler: `launch`, a sweep's point run `--within` or `--pack`) is charged
    its share, the nodes it held for the time it ran; the facility charges the allocation, and
    `usage` counts a pack's job, not its points again."""
    if started is None or nodes == 0:
        return 0, 0.0, 0.0
    nodes = nodes if nodes is not None else asked_nodes
    seconds = elapsed if elapsed is not None else max(0.0, ended - started)
    try:
        recorded = json.loads(plan_json)
    except (ValueError, TypeError, RecursionError):
        recorded = None
    if not seconds:
        return nodes, seconds, 0.0
    rules = recorded_rules(recorded)
    # No rules: recorded before plans were priced, or edited.
    price = rules.charge(nodes, seconds) if rules else nodes * seconds / 3600
    return nodes, seconds, price if math.isfinite(price) and price >= 0 else nodes * seconds / 3600


def most_of(plan: Any, otherwise: float) -> float:
    """The most a recorded plan (Plan.to_dict) can be charged; `otherwise` without its rules."""
    rules = recorded_rules(plan)
    return rules.most if rules else otherwise


# The numbers of a recorded plan's rules: (least, most, whole).
_RULES = {
    "nodes": (0, MAX_INT, True),
    "spare_nodes": (0, MAX_INT, True),
    "walltime": (0, MAX_INT, True),
    "minimum": (0, MAX_INT, True),
    "factor": (0, sys.float_info.max, False),
    "share": (0, 1, False),
}


def recorded_rules(plan: Any) -> CostPlan | None:
    """The pricing rules a recorded plan holds, each number checked (the job database is
    readable, so it may have been changed by hand); None where it holds none as mmm-orch writes
    them."""
    try:
        rules = plan["cost"]
        numbers = {
            name: bounded(name, rules[name], least, most, "", whole)
            for name, (least, most, whole) in _RULES.items()
            if name in rules or name != "share"
        }  # (recorded before points shared nodes)
        if rules["charged_for"] not in ("elapsed", "walltime"):
            return None
        return CostPlan(unit=str(rules["unit"]), charged_for=rules["charged_for"], **numbers)
    except (TypeError, KeyError, InvalidValue):
        return None


def hours(value: float) -> str:
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def why(cost: CostPlan) -> str:
    """The most one job can be charged, as a product the user can check."""
    time = format_walltime(max(cost.walltime, cost.minimum))
    parts = [f"{cost.nodes} node(s)", time] + (
        [f"factor {cost.factor:g}"] if cost.factor != 1 else []
    )
    basis = (
        "charged for the walltime asked for"
        if cost.charged_for == "walltime"
        else "charged for the time used"
    )
    if cost.minimum and cost.minimum > cost.walltime:
        basis += f", at least {format_walltime(cost.minimum)}"
    return f"{' x '.join(parts)}; {basis}"


def lines(plan: Plan, links: int = 1) -> list[str]:
    """The plan's cost in words: the most it can be charged and why; for a chain of `links`, the
    worst case (every link runs its whole walltime) and the expected one (each link saves and
    stops before its walltime, as the watchdog asks)."""
    cost = plan.cost
    if cost is None:
        return []
    out = [f"Cost: at most {hours(cost.most)} {cost.unit} ({why(cost)})"]
    if cost.spare_nodes and cost.nodes > plan.layout.nodes:
        out.append(
            f"Spares: {cost.spare_nodes} node(s) held for failover are allocated, so "
            f"charged like active ones: {hours(cost.charge(cost.spare_nodes, cost.walltime))}"
            f" {cost.unit} of that"
        )
    if links > 1:
        expected = cost.charge(cost.nodes, expected_link_seconds(plan))
        out.append(
            f"Chain of {links}: at most {hours(links * cost.most)} {cost.unit} (every link "
            f"runs its whole walltime); expected {hours(links * expected)} (each link "
            f"stops {format_walltime(plan.guard.walltime_margin)} before its walltime; "
            "the chain ends sooner when the run finishes)"
        )
    if cost.budget is not None:
        out.append(f"Budget: {hours(cost.budget)} {cost.unit} (--max-node-hours)")
    return out


def sweep_most(plans: list[Plan]) -> float:
    return sum(plan.cost.most for plan in plans if plan.cost)


def sweep_cost(points) -> str:
    """A sweep's total in words (points: sweeps.Point, each with its plan)."""
    plans = [point.plan for point in points]
    unit = plans[0].cost.unit if plans[0].cost else "node-hours"
    budget = plans[0].cost.budget if plans[0].cost else None
    return (
        f"Cost: at most {hours(sweep_most(plans))} {unit} for the {len(plans)} points (each "
        "charged for the time it uses, up to its walltime)"
        + (f"; budget {hours(budget)}" if budget is not None else "")
    )


def expected_link_seconds(plan: Plan) -> float:
    """How long a chain link is expected to hold its nodes: until the watchdog's stop before the
    walltime where the trainer can save and stop, else the whole walltime."""
    walltime = plan.queue.walltime
    return walltime - plan.guard.walltime_margin if plan.stops_before_walltime else walltime


def check_max(what: str, most: float, budget: float | None, unit: str) -> None:
    """Refuse `most` over `budget` (--max-node-hours), with the numbers."""
    if budget is not None and most > budget:
        raise InvalidValue(
            "--max-node-hours",
            budget,
            f"at least {hours(most)}",
            f"--max-node-hours {hours(budget)}: {what} can be charged up to "
            f"{hours(most)} {unit}; allowed: a budget of at least that, or fewer "
            "nodes or a shorter walltime",
        )


def parse_budget(value: str | float | None) -> float | None:
    """--max-node-hours: a positive number of node-hours, or None."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past a float's range
        number = math.nan
    allowed = f"a positive number of node-hours, at most {MAX_NODE_HOURS:g}"
    if not 0 < number <= MAX_NODE_HOURS:
        raise InvalidValue("--max-node-hours", value, allowed)
    return number
