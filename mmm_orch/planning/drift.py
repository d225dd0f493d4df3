"""`mmm-orch machines check`: where a machine profile's queues differ from the scheduler's live
configuration (queues missing or extra, node and walltime bounds, job limits, routing tiers).
Pure: the live queues come from the scheduler's parsers, and the comparing is its kind's drift
reader (schedulers/<kind>/drift.py); here each queue gets the directives it is submitted with."""

from __future__ import annotations

from mmm_orch.config.machine import Machine
from mmm_orch.errors import MmmError
from mmm_orch.planning.queue_choice import queue_directives
from mmm_orch.schedulers import scheduler_kind
from mmm_orch.schedulers.drift import ProfileQueue
from mmm_orch.schedulers.states import LiveQueue


def differences(machine: Machine, live: list[LiveQueue]) -> list[str]:
    """Every difference between `machine`'s queues and `live`, one line each (a queue, partition
    or QOS two of the profile's queues share is said once)."""
    kind = scheduler_kind(machine.scheduler.kind)
    queues = [ProfileQueue(queue, queue_directives(machine, queue)) for queue in machine.queues]
    found = kind.differences(queues, live)
    if found is None:
        raise MmmError(f"scheduler kind {kind.name} has no queue configuration to compare with")
    return list(dict.fromkeys(found))
