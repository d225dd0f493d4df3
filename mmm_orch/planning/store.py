"""A plan as a job record stores it, read back for a rerun or a report. The record is a file the
user can edit: a plan whose fields are missing, or hold values of another type anywhere inside
them, is refused whole rather than half used. Records written before the plan had sections
(mmm-orch 0.x up to the sectioned Plan) hold it flat; they are read into the sections."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.planning.model import Launch, Plan

# Where each name of the flat plan went: (section, name in it).
FLAT_NAMES = {
    **{
        name: ("layout", name)
        for name in ("nodes", "ranks_per_node", "ranks", "gpus_per_node", "cpus_per_rank", "mesh")
    },
    "queue": ("queue", "name"),
    "queue_tier": ("queue", "tier"),
    "queue_reason": ("queue", "reason"),
    "queue_directives": ("queue", "directives"),
    "walltime": ("queue", "walltime"),
    "account": ("queue", "account"),
    "directives": ("queue", "resources"),
    "submit_dir_var": ("queue", "submit_dir_var"),
    "device": ("devices", "kind"),
    "torch_device": ("devices", "torch"),
    "backend": ("devices", "backend"),
    "device_index": ("devices", "index"),
    "physical_devices": ("devices", "physical"),
    "setup": ("environment", "setup"),
    "env": ("environment", "groups"),
    "environment": ("environment", "path"),
    "stage_env": ("environment", "stage"),
    "stage_dir": ("environment", "stage_dir"),
    **{
        name: ("launch", name)
        for name in (
            "launcher",
            "hosts",
            "per_node",
            "python",
            "python_is_submitters",
            "python_prefix",
            "trainer",
            "stop_signal",
            "workdir",
            "workdir_given",
        )
    },
    "trainer_args": ("launch", "args"),
    "trainer_options": ("launch", "options"),
    "watchdog_first_step": ("guard", "first_step_timeout"),
    "watchdog_step": ("guard", "step_timeout"),
    "walltime_margin": ("guard", "walltime_margin"),
    **{
        name: ("placement", name)
        for name in (
            "spare_nodes",
            "avoid_nodes",
            "node_list",
            "on_nodes",
            "host_addr",
            "exclude_directive",
            "failover_directives",
        )
    },
    "login_hosts": ("transport", "login_hosts"),
    "remote_jobs_dir": ("transport", "remote_jobs_dir"),
    **{name: ("submission", name) for name in ("job_dir", "tag", "log_path", "log_directive")},
    "chain_file": ("chain", "file"),
    "chain_link": ("chain", "link"),
    "chain_links": ("chain", "links"),
    "depends_on": ("chain", "depends_on"),
}

# The flat plan's computed names that moved into a section (for a template's error message).
MOVED_PROPERTIES = {
    "walltime_hms": "queue.walltime_hms",
    "failover": "placement.failover",
    "program": "launch.program",
    "run_dir": "launch.run_dir",
}


def sectioned(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the plan in sections: a flat plan of an older record is moved into them."""
    if "layout" in data or "nodes" not in data:
        return data
    out: dict[str, Any] = {}
    for name, value in data.items():
        section, new = FLAT_NAMES.get(name, (None, name))
        if section is None:
            out[name] = value
        else:
            out.setdefault(section, {})[new] = value
    return out


def section(data: dict[str, Any], name: str) -> dict[str, Any]:
    """One section of a recorded plan, {} where the record has none."""
    found = sectioned(data).get(name)
    return found if isinstance(found, dict) else {}


def stored_plan(data: dict[str, Any], what: str) -> Plan:
    """The Plan `data` (Plan.to_dict, or an older flat one) describes, or MmmError saying what in
    it is damaged."""
    data = sectioned(data)
    wrong = _missing(Plan, data) or misshapen(data)
    if wrong:
        raise MmmError(
            f"{what} is damaged ({wrong}): it was changed by hand or written by another "
            "mmm-orch; submit the workload anew"
        )
    return _built(Plan, data)


def _missing(kind: Any, data: dict[str, Any], where: str = "") -> str:
    """The first field without a default that `data` lacks, in the sections too, or ""."""
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        name = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return f"{name} missing"
        elif (
            dataclasses.is_dataclass(hints[f.name])
            and isinstance(data[f.name], dict)
            and (found := _missing(hints[f.name], data[f.name], name))
        ):
            return found
    return ""


def _built(kind: Any, value: Any) -> Any:
    """`value` (checked by misshapen) as `kind`: sections and entries as their dataclasses,
    lists as tuples."""
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(
            **{
                f.name: _built(hints[f.name], value[f.name])
                for f in dataclasses.fields(kind)
                if f.name in value
            }
        )
    if typing.get_origin(kind) is tuple:
        return tuple(_built(typing.get_args(kind)[0], item) for item in value)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        inner = [k for k in typing.get_args(kind) if k is not type(None)]
        return value if value is None or len(inner) != 1 else _built(inner[0], value)
    return value


def misshapen(value: Any, kind: Any = Plan, where: str = "") -> str:
    """What of `value` is not of the declared type `kind`, all the way down (a list of lines
    holding a number, an environment entry that is text), or "". A plan's trainer arguments are
    scalars, each for an option its trainer takes."""
    origin, inner = typing.get_origin(kind), typing.get_args(kind)
    wrong = f"{where or 'it'} is " + ("null" if value is None else f"a {type(value).__name__}")
    if kind is typing.Any:
        return ""
    if origin in (typing.Union, types.UnionType):
        each = [misshapen(value, k, where) for k in inner]
        return "" if "" in each else each[0]
    if kind is type(None):
        return "" if value is None else wrong
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            return wrong
        hints = typing.get_type_hints(kind)
        if kind is Launch:
            hints["args"] = dict[str, str | int | float | bool]
            options = value.get("options")
            if (
                isinstance(options, list)
                and isinstance(value.get("args"), dict)
                and (extra := set(value["args"]) - set(map(str, options)))
            ):
                return f"{where}.args has {sorted(extra)[0][:40]!r}, not an option of its trainer"
        return next(
            (
                found
                for name in hints
                if name in value
                and (
                    found := misshapen(
                        value[name], hints[name], f"{where}.{name}" if where else name
                    )
                )
            ),
            "",
        )
    if origin is tuple:
        if not isinstance(value, list):
            return wrong
        return next(
            (
                found
                for i, item in enumerate(value)
                if (found := misshapen(item, inner[0], f"{where}[{i}]"))
            ),
            "",
        )
    if origin is dict:
        if not isinstance(value, dict):
            return wrong
        return next(
            (
                found
                for k, v in value.items()
                if (found := misshapen(v, inner[1], f"{where}[{str(k)[:40]!r}]"))
            ),
            "",
        )
    if kind is float:
        return "" if type(value) in (int, float) else wrong
    return "" if type(value) is kind else wrong
