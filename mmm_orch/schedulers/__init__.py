"""The schedulers mmm-orch speaks to, one folder each (schedulers/<kind>/) holding all of it: its
Scheduler (submit, status, cancel) over pure output parsers tested on recorded outputs, its job
script template, the allocation a job of it sees in its environment, and how its live queues
compare with a profile's. The folder's __init__.py describes the kind (KIND, a SchedulerKind)
without importing the rest of it; this registry finds every folder, so that a folder is a kind.
Everything else asks here: the profiles' allowed kinds, the job scripts' job id, the code inside
a job ("has my job ended"). So this module and the kinds' __init__.py import nothing of the
profiles (config/ imports them) and nothing else of a kind's folder.

Shared by the kinds, beside this one: base.py (the submission protocol every command-driven
scheduler follows), states.py (the job states), allocation.py (the allocation a process runs in,
and host lists), drift.py (a queue's differences, said alike for every kind)."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import MmmError

if TYPE_CHECKING:
    from mmm_orch.hosts.transport import Runner
    from mmm_orch.schedulers.allocation import Allocation
    from mmm_orch.schedulers.base import Scheduler
    from mmm_orch.schedulers.drift import ProfileQueue
    from mmm_orch.schedulers.states import LiveQueue

HERE = Path(__file__).parent


@dataclass(frozen=True)
class SchedulerKind:
    """One kind of scheduler, as the KIND of its folder's __init__.py says: its name and what it
    has, each part named as "module:attribute" of its folder and imported only when it is used
    (the local kind's scheduler brings psutil, ~12 ms of a start-up, 2-core host, 2026-11-26)."""

    # What a profile's `scheduler.kind` says, and the folder's name.
    name: str
    # Its Scheduler class, made with the profile's command names and the runner its commands go
    # through (here or on a login node).
    scheduler: str
    # Where a job finds its own id ("": nowhere, the job runs here without a scheduler).
    job_id_variable: str = ""
    # Jobs wait in its queues for the nodes it grants. False: a job runs at once on this
    # computer, with no queue, allocation, hold or chain.
    batch: bool = True
    # A function from the environment of one of its jobs (which sets job_id_variable) to the
    # Allocation the job runs in; "": it grants none to launch in.
    allocation: str = ""
    # A function from a profile's queues and the live ones its Scheduler's queue_config() reads
    # to their differences, one line each; "": it shows no queue configuration.
    drift: str = ""

    def part(self, where: str) -> Any:
        """The attribute `where` ("module:attribute") names in this kind's folder."""
        module, attribute = where.split(":")
        return getattr(importlib.import_module(f"{__name__}.{self.name}.{module}"), attribute)

    def new_scheduler(self, commands: dict[str, str], runner: Runner) -> Scheduler:
        return self.part(self.scheduler)(commands, runner)

    def read_allocation(self, environ: Mapping[str, str]) -> Allocation | None:
        return self.part(self.allocation)(environ) if self.allocation else None

    def differences(
        self, queues: Sequence[ProfileQueue], live: list[LiveQueue]
    ) -> list[str] | None:
        """Where the profile's queues differ from the live ones; None: the kind cannot say."""
        return self.part(self.drift)(queues, live) if self.drift else None


@functools.cache
def kinds() -> dict[str, SchedulerKind]:
    """Every kind by name, in the order of the names: each folder here with an __init__.py."""
    found = {}
    for name in sorted(os.listdir(HERE)):
        if (HERE / name / "__init__.py").is_file():
            kind = importlib.import_module(f"{__name__}.{name}").KIND
            if kind.name != name:
                raise MmmError(f"scheduler folder {name}: its KIND is named {kind.name!r}")
            found[name] = kind
    return found


def kind_names() -> tuple[str, ...]:
    return tuple(kinds())


def scheduler_kind(name: str) -> SchedulerKind:
    known = kinds()
    if name not in known:
        raise MmmError(f"scheduler kind {name!r} is not supported: expected {', '.join(known)}")
    return known[name]


def scheduler_for(kind: str, commands: dict[str, str], runner: Runner | None = None) -> Scheduler:
    """The Scheduler of a profile's `scheduler.kind`, with the profile's command names."""
    if runner is None:
        from mmm_orch.hosts.transport import LocalRunner

        runner = LocalRunner()
    return scheduler_kind(kind).new_scheduler(commands, runner)


def job_id_variables() -> tuple[str, ...]:
    """Every kind's job id variable, in the kinds' order: a job script asks them all, since
    `launch` runs the local kind's script inside another kind's job."""
    return tuple(kind.job_id_variable for kind in kinds().values() if kind.job_id_variable)


def job_in(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(kind, job id) of the job this process runs in: the first kind whose job id variable is
    set, in the order a job script asks them; ("", "") outside any."""
    env = os.environ if environ is None else environ
    for kind in kinds().values():
        if kind.job_id_variable and env.get(kind.job_id_variable):
            return kind.name, env[kind.job_id_variable]
    return "", ""


def current_allocation(environ: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation this process runs in, as its kind reads it from the environment (job_in
    finds the kind); None outside any, or in a job of a kind that grants none to launch in."""
    env = os.environ if environ is None else environ
    name, _ = job_in(env)
    return scheduler_kind(name).read_allocation(env) if name else None


def template_dirs() -> list[Path]:
    """The kinds' folders, where their job script templates (<kind>.sh.j2) are."""
    return [HERE / name for name in kinds()]
