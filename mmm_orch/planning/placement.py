"""A plan placed on an allocation the scheduler already gave: which machine it is (by the
profiles' hostnames), which of its nodes a launch takes, and the plan moved onto them."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
from pathlib import Path

from mmm_orch.config import registry
from mmm_orch.errors import MmmError
from mmm_orch.hosts.transport import LocalRunner
from mmm_orch.planning.model import Plan, Request
from mmm_orch.schedulers.allocation import Allocation, node_names


def as_the_profile_lists(machine: str, node_list: str, allocation: Allocation) -> Allocation:
    """The allocation's nodes as the machine's profile lists them (scheduler.node_list: the
    test server's vnodes share one host, so its node file names that host once), else as the
    scheduler's variables do."""
    if not node_list:
        return allocation
    result = LocalRunner().run(["bash", "-c", node_list], timeout=60)
    nodes = tuple(node_names(result.stdout, f"machine {machine}: scheduler.node_list"))
    if result.returncode != 0 or not nodes:
        raise MmmError(
            f"machine {machine}: scheduler.node_list found no nodes in "
            f"{allocation.scheduler} job {allocation.job_id} (exit {result.returncode}: "
            f"{result.stderr.strip()[:200]})"
        )
    return dataclasses.replace(allocation, nodes=nodes)


def which_machine(named: str, allocation: Allocation | None, hostname: str) -> str:
    """The machine `launch` runs on: `named` when given (refused when this allocation's nodes
    match other profiles' hostnames and not its own), else the one profile whose hostnames match
    the allocation's first node, or this host outside any; `local` where none does outside one."""
    if named and allocation is None:
        return named  # no nodes to contradict it: the profiles need not be read
    matching, declaring = _matching_profiles(allocation, hostname)
    where = (
        f"{allocation.scheduler} job {allocation.job_id} (first node "
        f"{allocation.nodes[0] if allocation.nodes else 'none'})"
        if allocation
        else f"this host ({hostname})"
    )
    if named:  # (one of another scheduler than the allocation's is refused with that reason)
        same_kind = allocation is None or declaring.get(named) == allocation.scheduler
        if matching and named not in matching and named in declaring and same_kind:
            raise MmmError(
                f"machine {named!r} is invalid here: {where} matches the hostnames of "
                f"{', '.join(matching)}, not {named}'s; leave MACHINE out or name it"
            )
        return named
    if len(matching) == 1:
        return matching[0]
    if matching:
        raise MmmError(
            f"MACHINE is missing: {where} matches the hostnames of {', '.join(matching)}; name one"
        )
    if allocation is None:
        return "local"
    raise MmmError(
        f"MACHINE is missing: no machine profile's hostnames match {where}; name it "
        "(`mmm-orch machines`), or give its profile `hostnames:`"
    )


def _matching_profiles(
    allocation: Allocation | None, hostname: str
) -> tuple[list[str], dict[str, str]]:
    """The profiles whose hostnames match (inside an allocation: its first node as the scheduler
    names it), and every profile that declares hostnames, with its scheduler's kind. Matching
    reads the profiles as data: a profile's commands (scheduler.node_list) run only once it is
    the machine in use, never to find out whether it is (a colleague's profile in the directory
    would otherwise run its node_list here)."""
    matching: list[str] = []
    declaring: dict[str, str] = {}
    for name in registry.names("machines"):
        try:
            machine = registry.load_machine(name)
        except MmmError:
            continue  # a broken profile is reported when it is named, not here
        if not machine.hostnames:
            continue
        declaring[name] = machine.scheduler.kind
        if allocation is not None and machine.scheduler.kind != allocation.scheduler:
            continue
        host = hostname
        if allocation is not None:
            host = allocation.nodes[0] if allocation.nodes else ""
        if any(re.fullmatch(pattern, host) for pattern in machine.hostnames):
            matching.append(name)
    return matching, declaring


def nodes_for(
    allocation: Allocation, request: Request, first_node: int, bad: tuple[str, ...]
) -> tuple[str, ...]:
    """The allocation's nodes the launch runs on: all but the known-bad ones (`bad`), or
    `request.nodes` of them from `first_node` on (two launches side by side take disjoint ones)."""
    pool = [node for node in allocation.nodes if node not in bad]
    left_out = (
        f" ({len(allocation.nodes) - len(pool)} known-bad left out: `mmm-orch nodes`)"
        if len(pool) < len(allocation.nodes)
        else ""
    )
    if first_node < 0 or first_node >= max(len(pool), 1):
        raise MmmError(
            f"--first-node {first_node} is invalid: {allocation.scheduler} job "
            f"{allocation.job_id} has {len(pool)} usable nodes{left_out}, numbered from 0"
        )
    count = request.nodes if request.nodes is not None else len(pool) - first_node
    if count < 1 or first_node + count > len(pool):
        raise MmmError(
            f"--nodes {count} is invalid: {allocation.scheduler} job "
            f"{allocation.job_id} has {len(pool)} usable nodes{left_out}"
            + (f", {len(pool) - first_node} of them from node {first_node}" if first_node else "")
        )
    return tuple(pool[first_node : first_node + count])


def placed_on(plan: Plan, allocation: Allocation, nodes: tuple[str, ...], jobs_root: Path) -> Plan:
    """`plan` run in the current directory, on `nodes`: the launcher's own default where they are
    the whole allocation, its words for "these nodes" (the profile's launcher.on_nodes) where
    they are some of it."""
    queue = dataclasses.replace(
        plan.queue, submit_dir_var=""
    )  # here, not where the allocation began
    # No screen: the allocation's own job had its nodes screened, and a run on some of them
    # has no launch of its own over them to screen with.
    plan = dataclasses.replace(
        plan, queue=queue, guard=dataclasses.replace(plan.guard, screen=None)
    )
    if nodes == allocation.nodes:
        return plan
    words = plan.placement.on_nodes
    if not words:
        raise MmmError(
            f"--nodes {len(nodes)}: {plan.machine}'s launcher cannot run on some of the "
            "allocation's nodes (its profile has no launcher.on_nodes)"
        )
    hostfile = ""
    if "{hostfile}" in words:  # named by its content: the same nodes reuse one file
        text = "".join(f"{node}\n" for node in nodes)
        path = jobs_root / f"launch-hosts-{hashlib.sha256(text.encode()).hexdigest()[:16]}.txt"
        if not path.exists():
            jobs_root.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(text)
            partial.replace(path)
        hostfile = str(path)
    hosts = words.format(nodelist=shlex.quote(",".join(nodes)), hostfile=shlex.quote(hostfile))
    return plan.with_launch(hosts=hosts)
