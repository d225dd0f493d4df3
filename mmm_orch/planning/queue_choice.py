"""Which queue a plan goes to, for how long and on whose account: the walltime asked for (or the
spec's), the first automatic queue (or tier) that fits the nodes and the walltime and has room
for the user's jobs under its limits (planning/occupancy.py), its directives, the account."""

from __future__ import annotations

import os

from mmm_orch.config.machine import Machine
from mmm_orch.config.queues import Queue
from mmm_orch.config.registry import unknown_name
from mmm_orch.config.workload import MachineOverride, Workload
from mmm_orch.errors import InvalidValue, MmmError, QueueFull
from mmm_orch.planning.checks import SAFE_WORD, fail
from mmm_orch.planning.model import Request
from mmm_orch.planning.occupancy import NOTHING_YET, QueueLoad, past_limit, way_out
from mmm_orch.walltime import format_walltime, parse_walltime


def walltime(
    machine: Machine, workload: Workload, override: MachineOverride | None, request: Request
) -> int:
    if request.walltime is not None:
        try:
            walltime = parse_walltime(request.walltime)
        except ValueError as exc:
            raise InvalidValue(
                "--walltime", request.walltime, str(exc), f"--walltime: {exc}"
            ) from None
    else:
        walltime = (override and override.walltime) or workload.defaults.walltime
    if machine.min_walltime and walltime < machine.min_walltime:
        raise fail(
            "--walltime",
            format_walltime(walltime),
            f"{machine.name} needs at least {format_walltime(machine.min_walltime)}",
        )
    return walltime


def pick_queue(machine: Machine, request: Request, account: str | None, nodes: int, walltime: int):
    """(queue, tier name, reason) for the request, or an error that names the limits. With the
    jobs the user already has (request.queue_load), a queue the request would fill past a job
    limit is skipped (named in the reason), or refused when asked for by name."""
    if not machine.queues:
        if request.queue:
            raise fail("--queue", request.queue, f"{machine.name} has no queues")
        return None, None, "no scheduler queue on this machine"
    load = request.queue_load or NOTHING_YET
    if request.queue:
        queue = machine.queue(request.queue)
        if queue is None:
            raise unknown_name(
                f"queue on {machine.name}", request.queue, [q.name for q in machine.queues]
            )
        ok, tier, why = _fits(queue, nodes, walltime)
        if not ok:
            raise MmmError(
                f"--queue {queue.name!r} cannot run {nodes} nodes for {format_walltime(walltime)}: "
                f"it {why} ({queue.limits()})"
            )
        full = past_limit(
            machine, queue, queue_directives(machine, queue), load, account, request.jobs
        )
        if full:
            room = queues_with_room(machine, nodes, walltime, load, account, request.jobs)
            raise QueueFull(f"--queue {queue.name!r} is full for you: {full}. {way_out(room)}")
        return queue, tier, "requested"
    tried, skipped = [], []
    for queue in machine.queues:
        if not queue.automatic or queue.by_request:
            continue
        ok, tier, why = _fits(queue, nodes, walltime)
        if not ok:
            tried.append(f"{queue.name} ({queue.limits()})")
            continue
        full = past_limit(
            machine, queue, queue_directives(machine, queue), load, account, request.jobs
        )
        if full:
            skipped.append(full)
            continue
        reason = "first queue that fits nodes and walltime"
        if skipped:
            reason = f"{reason} and the job limits (skipped: {'; '.join(skipped)})"
        return queue, tier, reason
    if skipped:
        room = queues_with_room(machine, nodes, walltime, load, account, request.jobs)
        raise QueueFull(
            f"no queue on {machine.name} that is picked without --queue can take "
            f"{request.jobs} more job{'s' if request.jobs > 1 else ''} of {nodes} "
            f"nodes for {format_walltime(walltime)}: {'; '.join(skipped)}. "
            f"{way_out(room)}"
        )
    raise MmmError(
        f"no queue on {machine.name} fits {nodes} nodes for {format_walltime(walltime)}; "
        f"automatic queues: {'; '.join(tried)}. Change --nodes/--walltime or name a --queue"
    )


def queues_with_room(
    machine: Machine, nodes: int, walltime: int, load: QueueLoad, account: str | None, jobs: int
) -> list[str]:
    """The queues (those picked only by name too) that fit `nodes` for `walltime` and have room
    for `jobs` more of the user's jobs."""
    ordered = sorted(machine.queues, key=lambda queue: not queue.automatic)
    return [
        queue.name
        for queue in ordered
        if not queue.by_request
        and _fits(queue, nodes, walltime)[0]
        and not past_limit(machine, queue, queue_directives(machine, queue), load, account, jobs)
    ]


def _fits(queue: Queue, nodes: int, walltime: int) -> tuple[bool, str | None, str]:
    """(fits, tier name, why not) of `queue` for `nodes` nodes and `walltime` seconds."""
    if not queue.min_nodes <= nodes <= queue.max_nodes:
        return False, None, f"takes {queue.min_nodes}-{queue.max_nodes} nodes"
    if queue.tiers:
        tier = next((t for t in queue.tiers if t.min_nodes <= nodes <= t.max_nodes), None)
        if tier is None:
            return False, None, "no tier for this node count"
        if walltime > tier.max_walltime:
            label = f"tier {tier.name}" if tier.name else f"{tier.min_nodes}-{tier.max_nodes} nodes"
            return (
                False,
                tier.name or None,
                (f"allows at most {format_walltime(tier.max_walltime)} for {label}"),
            )
        return True, tier.name or None, ""
    if walltime > queue.max_walltime:
        return False, None, f"allows at most {format_walltime(queue.max_walltime)}"
    return True, None, ""


def queue_directives(machine: Machine, queue: Queue | None) -> tuple[str, ...]:
    if queue is None:
        return ()
    templates = (
        queue.directives if queue.directives is not None else [machine.scheduler.queue_directive]
    )
    return tuple(t.format(queue=queue.name) for t in templates if t)


def account_for(machine: Machine, request: Request) -> str | None:
    account = (
        request.account or os.environ.get("MMM_ORCH_ACCOUNT") or machine.account.default or None
    )
    if machine.account.required and not account:
        raise MmmError(f"--account is required on {machine.name} (or set MMM_ORCH_ACCOUNT)")
    if account and not SAFE_WORD.match(account):
        raise fail("--account", account, "use letters, digits, '_', '.', '+', '-'")
    return account
