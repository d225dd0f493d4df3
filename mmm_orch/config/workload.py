"""Workload spec: which trainer to run, its typed options, layout and per-machine overrides."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from mmm_orch.config.common import EnvName, NonEmptyStr, Strict, Walltime

_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_OPTION = re.compile(r"^[a-z][a-z0-9_]*$")


class Option(Strict):
    """One trainer option that --set may give; passed as --name value (bools as --name/--no-name)."""

    type: Literal["int", "float", "str", "bool", "choice"]
    default: Any = None
    choices: list[str] = []
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


class Defaults(Strict):
    nodes: int = Field(1, ge=1)
    walltime: Walltime = 3600


class Resources(Strict):
    # Refuse machines whose nodes have no accelerator (e.g. an 8B model on a laptop CPU).
    accelerator: bool = False
    min_gpu_memory_gib: float | None = None


class MachineOverride(Strict):
    args: dict[str, Any] = {}
    env: dict[EnvName, str] = {}
    presets: list[str] = []
    no_presets: list[str] = []
    nodes: int | None = Field(None, ge=1)
    walltime: Walltime | None = None


class Workload(Strict):
    name: NonEmptyStr
    description: str = ""
    trainer: NonEmptyStr  # python -m <trainer>
    options: dict[str, Option] = {}
    args: dict[str, Any] = {}  # options always passed, before per-machine args and --set
    defaults: Defaults = Defaults()
    resources: Resources = Resources()
    env: dict[EnvName, str] = {}
    machines: dict[str, MachineOverride] = {}

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
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
        return self

    def layout_value(self, name: str, args: dict[str, Any]) -> int:
        """tp/pp as set in args, else the option default, else 1."""
        if name in args:
            return int(args[name])
        option = self.options.get(name)
        return int(option.default) if option and option.default is not None else 1
