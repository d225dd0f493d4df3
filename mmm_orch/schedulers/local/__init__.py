"""No scheduler: the local executor runs a job at once on this computer, detached under a
supervisor of its own (scheduler.py, supervisor.py), from a script without directives
(local.sh.j2). It is also what `launch` runs a job with inside another scheduler's allocation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmm_orch.schedulers import SchedulerKind

if TYPE_CHECKING:
    from mmm_orch.hosts.transport import Runner
    from mmm_orch.schedulers.local.scheduler import LocalScheduler


def _scheduler(commands: dict[str, str], runner: Runner) -> LocalScheduler:
    from mmm_orch.schedulers.local.scheduler import LocalScheduler  # brings psutil: ~12 ms

    return LocalScheduler()  # no commands: it runs the script itself, here


KIND = SchedulerKind(name="local", scheduler=_scheduler, batch=False)
