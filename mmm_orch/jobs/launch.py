"""`mmm-orch launch`: a plan run inside an allocation the scheduler already gave (interactive, or
a batch script someone else wrote). The script is the one a batch job of the same plan would
run, rendered by the same template; it runs on this node under the local executor's supervisor
(walltime, cancel, exit code), on the allocation's nodes through the machine's launcher."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.plan import Plan, Request
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.allocation import Allocation, unique_lines
from mmm_orch.transport import LocalRunner


def as_the_profile_lists(plan: Plan, allocation: Allocation) -> Allocation:
    """The allocation's nodes as the machine's profile lists them (scheduler.node_list: the
    test server's vnodes share one host, so its node file names that host once), else as the
    scheduler's variables do."""
    if not plan.placement.node_list:
        return allocation
    result = LocalRunner().run(["bash", "-c", plan.placement.node_list], timeout=60)
    nodes = tuple(unique_lines(result.stdout))
    if result.returncode != 0 or not nodes:
        raise MmmError(f"machine {plan.machine}: scheduler.node_list found no nodes in "
                       f"{allocation.scheduler} job {allocation.job_id} (exit {result.returncode}: "
                       f"{result.stderr.strip()[:200]})")
    return dataclasses.replace(allocation, nodes=nodes)


def nodes_for(allocation: Allocation, request: Request, first_node: int,
              bad: tuple[str, ...]) -> tuple[str, ...]:
    """The allocation's nodes the launch runs on: all but the known-bad ones (`bad`), or
    `request.nodes` of them from `first_node` on (two launches side by side take disjoint ones)."""
    pool = [node for node in allocation.nodes if node not in bad]
    left_out = f" ({len(allocation.nodes) - len(pool)} known-bad left out: `mmm-orch nodes`)" \
        if len(pool) < len(allocation.nodes) else ""
    if first_node < 0 or first_node >= max(len(pool), 1):
        raise MmmError(f"--first-node {first_node} is invalid: {allocation.scheduler} job "
                       f"{allocation.job_id} has {len(pool)} usable nodes{left_out}, numbered from 0")
    count = request.nodes if request.nodes is not None else len(pool) - first_node
    if count < 1 or first_node + count > len(pool):
        raise MmmError(f"--nodes {count} is invalid: {allocation.scheduler} job "
                       f"{allocation.job_id} has {len(pool)} usable nodes{left_out}"
                       + (f", {len(pool) - first_node} of them from node {first_node}" if first_node else ""))
    return tuple(pool[first_node:first_node + count])


def placed_on(plan: Plan, allocation: Allocation, nodes: tuple[str, ...], jobs_root: Path) -> Plan:
    """`plan` run in the current directory, on `nodes`: the launcher's own default where they are
    the whole allocation, its words for "these nodes" (the profile's launcher.on_nodes) where
    they are some of it."""
    queue = dataclasses.replace(plan.queue, submit_dir_var="")  # here, not where the allocation began
    plan = dataclasses.replace(plan, queue=queue)
    if nodes == allocation.nodes:
        return plan
    words = plan.placement.on_nodes
    if not words:
        raise MmmError(f"--nodes {len(nodes)}: {plan.machine}'s launcher cannot run on some of the "
                       "allocation's nodes (its profile has no launcher.on_nodes)")
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


def allocation_hint(plan: Plan) -> str:
    """The command that gets an allocation for `plan` (its account, queue, walltime and resource
    directives), to run `launch` in."""
    scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
    directives = [word for line in (*plan.queue.directives, *plan.queue.resources)
                  for word in shlex.split(line)]
    argv = scheduler.allocate_argv(plan.queue.account, plan.queue.walltime_hms, directives)
    return shlex.join(argv)
