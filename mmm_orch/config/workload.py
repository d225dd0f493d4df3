"""Workload spec: which trainer to run, its typed options, layout and per-machine overrides."""

from __future__ import annotations

import re
from dataclasses import field
from typing import Any, Literal

from mmm_orch.config.common import EnvName, NonEmptyStr, PositiveInt, Walltime, config

_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_OPTION = re.compile(r"^[a-z][a-z0-9_]*$")


@config
class Option:
    """One trainer option that --set may give; passed as --name value (bools as --name/--no-name)."""

    type: Literal["int", "float", "str", "bool", "choice"]
    default: Any = None
    choices: list[str] = field(default_factory=list)
    help: str = ""

    def coerce(self, name: str, value: Any) -> Any:
        """The typed value, or ValueError naming the option, the value and what is allowed."""
        text = value if isinstance(value, str) else None
        try:
            if self.type == "bool":
                if isinstance(value, bool):
                    return value
                lowered = (text or "").lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if self.type == "int":
                if isinstance(value, bool):
                    raise ValueError
                return int(value)
            if self.type == "float":
                if isinstance(value, bool):
                    raise ValueError
                return float(value)
            if self.type == "choice":
                if str(value) not in self.choices:
                    raise ValueError
                return str(value)
            return str(value)
        except (TypeError, ValueError):
            allowed = {
                "bool": "true or false",
                "int": "an integer",
                "float": "a number",
                "choice": "one of " + ", ".join(self.choices),
            }.get(self.type, "a string")
            raise ValueError(f"option {name}={value!r} is not {allowed}") from None


@config
class Defaults:
    nodes: PositiveInt = 1
    walltime: Walltime = 3600


@config
class Resources:
    # Refuse machines whose nodes have no accelerator (e.g. an 8B model on a laptop CPU).
    accelerator: bool = False
    min_gpu_memory_gib: float | None = None


@config
class Watchdog:
    """Ends a launch in which no training step completed for too long (a hung collective), so it
    does not burn the whole allocation: the job exits 124 and is recorded `hung`."""

    enabled: bool = True
    first_step_timeout: Walltime = 1800  # launch to first step: imports, init, compile
    step_timeout: Walltime = 900         # between two completed steps


@config
class MachineOverride:
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[EnvName, str] = field(default_factory=dict)
    presets: list[str] = field(default_factory=list)
    no_presets: list[str] = field(default_factory=list)
    nodes: PositiveInt | None = None
    walltime: Walltime | None = None


@config
class Workload:
    name: NonEmptyStr
    description: str = ""
    trainer: NonEmptyStr  # python -m <trainer>
    options: dict[str, Option] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)  # options always passed, before per-machine args and --set
    defaults: Defaults = field(default_factory=Defaults)
    resources: Resources = field(default_factory=Resources)
    watchdog: Watchdog = field(default_factory=Watchdog)
    env: dict[EnvName, str] = field(default_factory=dict)
    machines: dict[str, MachineOverride] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _MODULE.match(self.trainer):
            raise ValueError(f"trainer {self.trainer!r} is not a python module path")
        for name, option in self.options.items():
            if not _OPTION.match(name):
                raise ValueError(f"option name {name!r} must be lower_snake_case")
            if option.type == "choice" and not option.choices:
                raise ValueError(f"option {name} is a choice without choices")
            if option.default is not None:
                option.coerce(name, option.default)
        for where, args in [("args", self.args)] + [
            (f"machines.{m}.args", o.args) for m, o in self.machines.items()
        ]:
            for key, value in args.items():
                if key not in self.options:
                    raise ValueError(f"{where}: {key!r} is not one of the workload's options")
                self.options[key].coerce(key, value)

    def layout_value(self, name: str, args: dict[str, Any]) -> int:
        """tp/pp as set in args, else the option default, else 1."""
        if name in args:
            return int(args[name])
        option = self.options.get(name)
        return int(option.default) if option and option.default is not None else 1
