"""mmm-orch: turn a machine profile and a workload spec into a correct, reviewable, tracked job.

From Python (mmm_orch/api/__init__.py; docs/reference/commands.md, "From Python"):

    import mmm_orch
    job = mmm_orch.submit("slurm-local", "fsdp", nodes=2, options={"epochs": 1})
    job.wait()

The names below load on first use, so that `import mmm_orch` (and the CLI) stays instant. No
module or package of mmm_orch has an API name (rendering/, not render/), so an import of
one never hides the API's function of that name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "Allocation",
    "ConfigError",
    "InvalidValue",
    "Job",
    "MmmError",
    "SchedulerError",
    "SchedulerUnavailable",
    "Sweep",
    "UnknownName",
    "__version__",
    "allocate",
    "allocation",
    "backlog",
    "balance",
    "job",
    "jobs",
    "plan",
    "refresh",
    "render",
    "report",
    "submit",
    "sweep",
    "usage",
]
_ERRORS = frozenset(
    {
        "MmmError",
        "InvalidValue",
        "UnknownName",
        "ConfigError",
        "SchedulerError",
        "SchedulerUnavailable",
    }
)
_API = frozenset(__all__) - _ERRORS - {"__version__"}  # mmm_orch/api/__init__.py's names

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ below
    from mmm_orch.api import (
        Allocation,
        Job,
        Sweep,
        allocate,
        allocation,
        backlog,
        balance,
        job,
        jobs,
        plan,
        refresh,
        render,
        report,
        submit,
        sweep,
        usage,
    )
    from mmm_orch.errors import (
        ConfigError,
        InvalidValue,
        MmmError,
        SchedulerError,
        SchedulerUnavailable,
        UnknownName,
    )
    from mmm_orch.version import __version__


def __getattr__(name: str) -> Any:
    if name in _API:
        from mmm_orch import api  # the API loads the use cases: only when it is used

        return getattr(api, name)
    if name == "__version__":  # (in-job code imports this package: it loads nothing more)
        from mmm_orch.version import __version__

        return __version__
    if name in _ERRORS:
        from mmm_orch import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'mmm_orch' has no attribute {name!r}")
