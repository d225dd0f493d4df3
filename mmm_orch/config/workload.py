"""Workload spec: which trainer to run, its typed options, layout and per-machine overrides."""

from __future__ import annotations

import math
import re
from dataclasses import field
from typing import Annotated, Any, Literal

from mmm_orch.config.common import (
    Check,
    EnvName,
    Flag,
    NonEmptyStr,
    Number,
    PositiveInt,
    Walltime,
    config,
)

_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_OPTION = re.compile(r"^[a-z][a-z0-9_]*$")
# Trainer options that define the parallel mesh; always passed explicitly to the trainer.
LAYOUT_OPTIONS = ("tp", "pp", "cp")


@config
class Option:
    """One trainer option that --set may give; passed as --name value (bools as --name/--no-name).
    Numbers may carry bounds (`ge`, `gt`, `le`); floats are always finite; a `pattern` (a full
    match) constrains strings. Every bad value is refused before anything is written."""

    # What the value is; `choice`: one of `choices`.
    type: Literal["int", "float", "str", "bool", "choice"]
    # Its value when --set does not give one (the trainer's own default if none).
    default: Any = None
    # The values a `choice` takes.
    choices: list[str] = field(default_factory=list)
    # A number's lowest value.
    ge: Number | None = None
    # A number it must be above.
    gt: Number | None = None
    # A number's highest value.
    le: Number | None = None
    # A regular expression a string must match whole.
    pattern: str = ""
    # What it does, in one line.
    help: str = ""
    required: bool = False  # a run cannot start without it: planning refuses a plan that lacks it

    def __post_init__(self) -> None:
        # A choice is also shown in every error about the option: one line each.
        for choice in self.choices:
            if not choice.isprintable():
                raise ValueError(f"choices: {choice!r} is not one line of printable text")

    def allowed(self) -> str:
        """What a value must be, in words (for error messages)."""
        if self.type == "bool":
            return "true or false"
        if self.type == "choice":
            return "one of " + ", ".join(self.choices)
        if self.type == "str":
            return (
                f"one line of text matching {self.pattern}"
                if self.pattern
                else "one line of text (no control characters)"
            )
        bounds = [
            f">= {_num(self.ge)}" if self.ge is not None else "",
            f"> {_num(self.gt)}" if self.gt is not None else "",
            f"<= {_num(self.le)}" if self.le is not None else "",
        ]
        kind = "an integer" if self.type == "int" else "a finite number"
        return " ".join([kind, " and ".join(b for b in bounds if b)]).strip()

    def coerce(self, name: str, value: Any) -> Any:
        """The typed value, or ValueError naming the option, the value and what is allowed."""
        try:
            typed = self._typed(value)
        except (TypeError, ValueError, OverflowError):
            typed = None
        if typed is None or not self._within(typed):
            raise ValueError(f"option {name}={value!r} is invalid: {self.allowed()}")
        return typed

    def _typed(self, value: Any) -> Any:
        text = value if isinstance(value, str) else None
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            return {
                "1": True,
                "true": True,
                "yes": True,
                "on": True,
                "0": False,
                "false": False,
                "no": False,
                "off": False,
            }.get((text or "").strip().lower())
        if isinstance(value, bool):
            return None
        if self.type == "int":
            return (
                int(value.strip())
                if text is not None
                else (value if isinstance(value, int) else None)
            )
        if self.type == "float":
            number = float(value)
            return number if math.isfinite(number) else None
        if self.type == "choice":
            return str(value) if str(value) in self.choices else None
        return str(value)

    def _within(self, value: Any) -> bool:
        if self.type in ("int", "float"):
            return (
                (self.ge is None or value >= self.ge)
                and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le)
            )
        if self.type == "str":
            one_line = not any(
                ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in value
            )
            return one_line and (not self.pattern or re.fullmatch(self.pattern, value) is not None)
        return True


def with_run_options(data: Any) -> Any:
    """A spec's data as read, its `options` joined by the run options where it says
    `run_options: true`: the spec's own first, then each run option as RunOptions defines it,
    with what the spec (or one it extends) gives that option merged over it."""
    if not isinstance(data, dict) or data.get("run_options") is not True:
        return data
    own = data.get("options") or {}
    if not isinstance(own, dict):
        return data  # validation names what it should be
    from mmm_orch.options.run import RunOptions, described  # a cache miss only (registry.load)

    common = described(RunOptions)
    options = {name: spec for name, spec in own.items() if name not in common}
    for name, spec in common.items():
        given = own.get(name, {})
        options[name] = {**spec, **given} if isinstance(given, dict) else given
    return {**data, "options": options}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@config
class Defaults:
    # Nodes without --nodes.
    nodes: PositiveInt = 1
    # Walltime without --walltime (seconds, or HH:MM:SS in YAML).
    walltime: Walltime = 3600


def _registered_model(name: str) -> str:
    from mmm_orch import models  # validation only: the registry finds its folders when asked

    if name and name not in models.names():
        raise ValueError(f"not a registered model: one of {', '.join(models.names())} (or '')")
    return name


class _RegisteredModel(Check):
    """A model's name: '' or one of the registry's, which the JSON Schema lists."""

    def __init__(self) -> None:
        super().__init__(after=_registered_model)

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> Any:
        from mmm_orch import models

        return {"enum": ["", *models.names()], "type": "string"}


ModelName = Annotated[str, _RegisteredModel()]


@config
class Resources:
    # Refuse machines whose nodes have no accelerator (e.g. an 8B model on a laptop CPU).
    accelerator: Flag = False
    # Refuse machines whose devices have less memory.
    min_gpu_memory_gib: Number | None = None
    # The trainer's model, a name in the registry (mmm_orch/models/): its peak memory is
    # estimated per device (planning/memory.py) and a plan that cannot fit the profile's
    # gpu_memory_gib is refused; "" for none.
    memory_model: ModelName = ""


@config
class Watchdog:
    """Ends a launch in which no training step completed for too long (a hung collective), so it
    does not burn the whole allocation: the job exits 124 and is recorded `hung`."""

    # Whether the watchdog runs at all.
    enabled: Flag = True
    first_step_timeout: Walltime = 1800  # launch to first step: imports, init, compile
    step_timeout: Walltime = 900  # between two completed steps
    # Ask the trainers to save and stop this long before the walltime (at most a third of it;
    # raised in the job to twice the longest save seen).
    walltime_margin: Walltime = 120
    # What counts as progress: `step` (a step=N field, what the trainers print), `output` (any
    # line: an idle timeout, for a program that prints no steps), or a regular expression a
    # line must match.
    progress: NonEmptyStr = "step"

    def __post_init__(self) -> None:
        if self.progress not in ("step", "output"):
            try:
                re.compile(self.progress)
            except re.error as exc:
                raise ValueError(
                    f"progress {self.progress!r}: not step, output or a regular expression ({exc})"
                ) from None


@config
class MachineOverride:
    # Trainer options on this machine, over the workload's args.
    args: dict[str, Any] = field(default_factory=dict)
    # Extra environment variables on this machine.
    env: dict[EnvName, str] = field(default_factory=dict)
    # The machine's presets turned on for this workload.
    presets: list[str] = field(default_factory=list)
    # The machine's presets turned off for this workload.
    no_presets: list[str] = field(default_factory=list)
    # Default nodes on this machine.
    nodes: PositiveInt | None = None
    # Default walltime on this machine.
    walltime: Walltime | None = None
    # The machine's software stack for this workload (--stack wins); default: the machine's.
    stack: str | None = None


@config
class Workload:
    # The name `mmm-orch submit MACHINE NAME` takes; the file's name, too.
    name: NonEmptyStr
    # One line about it, as `mmm-orch workloads` shows it.
    description: str = ""
    # python -m <trainer>; "" for a workload that runs the user's command (`-- CMD ARGS...`)
    trainer: str = ""
    # The trainer has a `layout(cfg, rt)`: --verify checks a plan's layout with it, the real
    # model and parallelization at the job's world size under fake tensors (trainers/verify.py).
    layout_check: Flag = False
    # Only without a trainer: the command keeps mmm-orch's runtime contract (docs/runtime.md:
    # save and exit 75 on the stop signal, resume when told), so chains, failover resumes and the
    # stop before the walltime apply to it. A trainer's own --resume option says that for it.
    resumable: Flag = False
    # The trainer takes mmm-orch's run options (mmm_orch/options/run.py: dtype, seed, the run
    # directory, checkpoints, trackers, resume, profiling): they join `options` after the spec's
    # own, as RunOptions defines them; `options` may give one a default of its own.
    run_options: Flag = False
    # The trainer options --set may give, with their types and bounds.
    options: dict[str, Option] = field(default_factory=dict)
    args: dict[str, Any] = field(
        default_factory=dict
    )  # options always passed, before per-machine args and --set
    # Nodes and walltime when the command line gives none.
    defaults: Defaults = field(default_factory=Defaults)
    # What a machine must have for it.
    resources: Resources = field(default_factory=Resources)
    # When a launch that makes no progress is ended.
    watchdog: Watchdog = field(default_factory=Watchdog)
    # Extra environment variables for its jobs.
    env: dict[EnvName, str] = field(default_factory=dict)
    # Per machine (by name): its own options, variables, presets and defaults.
    machines: dict[str, MachineOverride] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.trainer and not _MODULE.match(self.trainer):
            raise ValueError(f"trainer {self.trainer!r} is not a python module path")
        if self.layout_check and not self.trainer:
            raise ValueError("layout_check: true needs a trainer whose layout it checks")
        if self.run_options and not self.trainer:
            raise ValueError("run_options: true needs a trainer to pass them to")
        if self.trainer and self.resumable:
            raise ValueError(
                "resumable: true is for a workload without a trainer (a trainer "
                "resumes when it takes a resume option)"
            )
        if not self.trainer and self.options:
            raise ValueError(
                "options need a trainer to pass them to (your command takes its "
                "own arguments after --)"
            )
        for name, option in self.options.items():
            if not _OPTION.match(name):
                raise ValueError(f"option name {name!r} must be lower_snake_case")
            if option.type == "choice" and not option.choices:
                raise ValueError(f"option {name} is a choice without choices")
            if option.type not in ("int", "float") and {option.ge, option.gt, option.le} != {None}:
                raise ValueError(f"option {name}: ge/gt/le bound numbers, not {option.type}")
            if option.pattern:
                if option.type != "str":
                    raise ValueError(f"option {name}: a pattern constrains str options only")
                try:
                    re.compile(option.pattern)
                except re.error as exc:
                    raise ValueError(f"option {name}: pattern {option.pattern!r}: {exc}") from None
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
        """A LAYOUT_OPTIONS size as set in args, else the option default, else 1."""
        if name in args:
            return int(args[name])
        option = self.options.get(name)
        return int(option.default) if option and option.default is not None else 1
