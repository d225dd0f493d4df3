"""The machine profiles and workload specs as data (`mmm-orch machines`, `workloads`, `show`,
`schema`): a row each to list, one whole to show, the JSON schema a file is checked against;
and `machines check`, a profile's queues against its scheduler's live configuration."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmm_orch.config import notes, registry
from mmm_orch.config.common import CONFIGURED
from mmm_orch.config.machine import Machine
from mmm_orch.config.workload import LAYOUT_OPTIONS, Workload
from mmm_orch.config.yamlio import adapter
from mmm_orch.errors import MmmError
from mmm_orch.walltime import format_walltime


def machine_rows() -> list[dict[str, Any]]:
    rows = []
    for name in registry.names("machines"):
        m = registry.load_machine(name)
        rows.append(
            {
                "name": m.name,
                "facility": m.facility,
                "scheduler": m.scheduler.kind,
                "max_nodes": m.max_nodes,
                "gpus_per_node": m.node.gpus,
                "device": m.node.device,
                "queues": [q.name for q in m.queues],
            }
        )
    return rows


def workload_rows() -> list[dict[str, Any]]:
    rows = []
    for name in registry.names("workloads"):
        w = registry.load_workload(name)
        layout = ", ".join(
            f"{k}={w.layout_value(k, w.args)}" for k in LAYOUT_OPTIONS if k in w.options
        )
        rows.append(
            {
                "name": w.name,
                "trainer": w.trainer.rsplit(".", 1)[-1] if w.trainer else "(your command after --)",
                "parallelism": (
                    f"FSDP2{' x TP' if 'tp' in w.options else ''}"
                    + (f" ({layout})" if layout else "")
                    if w.trainer
                    else "yours"
                ),
                "default_nodes": w.defaults.nodes,
                "default_walltime": format_walltime(w.defaults.walltime),
                "description": w.description,
            }
        )
    return rows


def show(kind: str, name: str, whole: bool) -> Any:
    """Profile or spec `name` (`kind`: "machine" or "workload") as plain data; without `whole`,
    only the values that differ from the defaults."""
    obj = registry.load_machine(name) if kind == "machine" else registry.load_workload(name)
    # As `type`: mypy reads a dataclass's `__hash__ = None` as the class object's, which is
    # hashable (by its metaclass) and is the adapter cache's key.
    cls: type = type(obj)
    return adapter(cls).dump_python(obj, mode="json", exclude_defaults=not whole)


def schema(kind: str) -> dict[str, Any]:
    """The JSON schema of a machine profile or a workload spec, each field described by the
    comments beside it in the code."""
    made = adapter(Machine if kind == "machine" else Workload).json_schema()
    return notes.describe(made, list(CONFIGURED.values()))


def is_machine(name: str) -> bool:
    return name in registry.names("machines")


def check_software(name: str, host: str | None = None, timeout: float | None = None):
    """Each of machine `name`'s stacks loaded in a clean shell here or on the login host, as a
    job would load it (planning/software.py); the result kept as the machine's last check.
    Stacks with nothing to check (no lines, nothing given or set) are left out."""
    from mmm_orch.config.registry import load_machine
    from mmm_orch.hosts import host_for
    from mmm_orch.planning import software
    from mmm_orch.schedulers import scheduler_kind
    from mmm_orch.usecases.submissions import target

    machine = load_machine(name)
    here = not scheduler_kind(machine.scheduler.kind).batch and host is None
    remote = "" if here else target(name, host)
    runner = host_for(remote)
    checks = [
        software.check_stack(machine, stack, runner.run, timeout or software.STACK_TIMEOUT)
        for stack in machine.stacks
        if stack.lines() or stack.gives or stack.sets
    ]
    software.save_checks(machine.name, remote, checks)
    return checks


def has_scheduler(name: str) -> bool:
    """Whether machine `name` has a batch scheduler whose queues `machines check` compares."""
    from mmm_orch.config.registry import load_machine
    from mmm_orch.schedulers import scheduler_kind

    return bool(scheduler_kind(load_machine(name).scheduler.kind).drift)


def check_machine(name: str, host: str | None = None) -> list[str]:
    """Where machine `name`'s queues differ from its scheduler's live configuration (asked here
    or on the login host, as a submission would be), one line each."""
    from mmm_orch.config.registry import load_machine
    from mmm_orch.hosts import host_for
    from mmm_orch.planning.drift import differences
    from mmm_orch.schedulers import scheduler_for, scheduler_kind
    from mmm_orch.schedulers.base import ListsQueues
    from mmm_orch.usecases.submissions import target

    machine = load_machine(name)
    if not scheduler_kind(machine.scheduler.kind).batch:
        raise MmmError(
            f"machines check: {name} runs jobs on this computer; it has no scheduler "
            "to compare with"
        )
    remote = target(name, host)
    scheduler = scheduler_for(
        machine.scheduler.kind,
        dataclasses.asdict(machine.scheduler.commands),
        host_for(remote) if remote else None,
    )
    if not isinstance(scheduler, ListsQueues):
        raise MmmError(
            f"machines check: {name}'s scheduler ({machine.scheduler.kind}) shows no "
            "queue configuration to compare with"
        )
    return differences(machine, scheduler.queue_config())
