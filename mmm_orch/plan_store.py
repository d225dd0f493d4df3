"""A plan as a job record stores it, read back for a rerun. The record is a file the user can
edit: a plan whose fields are missing, or hold values of another type anywhere inside them, is
refused whole rather than half used."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.plan import Plan


def stored_plan(data: dict[str, Any], what: str) -> Plan:
    """The Plan `data` (Plan.to_dict) describes, or MmmError saying what in it is damaged."""
    missing = [f.name for f in dataclasses.fields(Plan) if f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    wrong = f"{missing[0]} missing" if missing else misshapen(data)
    if wrong:
        raise MmmError(f"{what} is damaged ({wrong}): it was changed by hand or written by another "
                       "mmm-orch; submit the workload anew")
    return Plan(**{f.name: data[f.name] for f in dataclasses.fields(Plan) if f.name in data})


def misshapen(value: Any, kind: Any = Plan, where: str = "") -> str:
    """What of `value` is not of the declared type `kind`, all the way down (a list of lines
    holding a number, an environment entry that is text), or "". A plan's trainer arguments are
    scalars, each for an option its trainer takes."""
    origin, inner = typing.get_origin(kind), typing.get_args(kind)
    wrong = f"{where or 'it'} is " + ("null" if value is None else f"a {type(value).__name__}")
    if kind is typing.Any:
        return ""
    if origin in (typing.Union, types.UnionType):
        found = [misshapen(value, k, where) for k in inner]
        return "" if "" in found else found[0]
    if kind is type(None):
        return "" if value is None else wrong
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            return wrong
        hints = typing.get_type_hints(kind)
        if kind is Plan:
            hints["trainer_args"] = dict[str, str | int | float | bool]
            options = value.get("trainer_options")
            if isinstance(options, list) and isinstance(value.get("trainer_args"), dict) and \
                    (extra := set(value["trainer_args"]) - set(map(str, options))):
                return f"trainer_args has {sorted(extra)[0][:40]!r}, not an option of its trainer"
        return next((found for name in hints if name in value and (found := misshapen(
            value[name], hints[name], f"{where}.{name}" if where else name))), "")
    if origin is tuple:
        if not isinstance(value, list):
            return wrong
        return next((found for i, item in enumerate(value)
                     if (found := misshapen(item, inner[0], f"{where}[{i}]"))), "")
    if origin is dict:
        if not isinstance(value, dict):
            return wrong
        return next((found for k, v in value.items()
                     if (found := misshapen(v, inner[1], f"{where}[{str(k)[:40]!r}]"))), "")
    if kind is float:
        return "" if type(value) in (int, float) else wrong
    return "" if type(value) is kind else wrong
