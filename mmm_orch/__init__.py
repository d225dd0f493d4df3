"""mmm-orch: turn a machine profile and a workload spec into a correct, reviewable, tracked job.

From Python (mmm_orch/api.py; README "From Python"):

    import mmm_orch
    job = mmm_orch.submit("slurm-local", "fsdp", nodes=2, options={"epochs": 1})
    job.wait()

The names below load on first use, so that `import mmm_orch` (and the CLI) stays instant.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any


_API = ("Job", "Sweep", "balance", "job", "jobs", "plan", "refresh", "render", "report", "submit",
        "sweep", "usage")
_ERRORS = ("MmmError", "InvalidValue", "UnknownName", "ConfigError", "SchedulerError",
           "SchedulerUnavailable")
__all__ = ["Job", "Sweep", "balance", "job", "jobs", "plan", "refresh", "render", "report", "submit",
           "sweep", "usage",
           "MmmError", "InvalidValue", "UnknownName", "ConfigError", "SchedulerError",
           "SchedulerUnavailable", "__version__"]

if TYPE_CHECKING:  # what type checkers and editors see; at run time, _Package below
    from mmm_orch.api import (Job, Sweep, balance, job, jobs, plan, refresh, render,
                              report, submit, sweep, usage)
    from mmm_orch.errors import (ConfigError, InvalidValue, MmmError, SchedulerError,
                                 SchedulerUnavailable, UnknownName)


class _Package(types.ModuleType):
    """mmm_orch itself. `render` and `jobs` are also the names of a module and a package in it,
    which an import of them binds here: the API's functions win (those are imported from
    mmm_orch.render and mmm_orch.jobs.*, which reach them by sys.modules, never by attribute)."""

    def __getattribute__(self, name: str) -> Any:
        if name in _API:
            from mmm_orch import api

            return getattr(api, name)
        return super().__getattribute__(name)


def __getattr__(name: str) -> Any:
    if name == "__version__":  # (in-job code imports this package: it loads nothing more)
        from mmm_orch.version import __version__

        return __version__
    if name in _ERRORS:
        from mmm_orch import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'mmm_orch' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
