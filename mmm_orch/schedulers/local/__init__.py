"""No scheduler: the local executor runs a job at once on this computer, detached under a
supervisor of its own (scheduler.py, supervisor.py), from a script without directives
(local.sh.j2). It is also what `launch` runs a job with inside another scheduler's allocation."""

from __future__ import annotations

from mmm_orch.schedulers import SchedulerKind

KIND = SchedulerKind(name="local", scheduler="scheduler:LocalScheduler", batch=False)
