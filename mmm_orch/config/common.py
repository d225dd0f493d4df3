"""Building blocks shared by machine profiles and workload specs.

Config objects are frozen stdlib dataclasses. pydantic validates them (and exports their JSON
Schema) only when a file is new or has changed: the metadata below tells pydantic what to check
without importing it or annotated_types, which keeps `mmm-orch render` fast.
"""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from mmm_orch.dataclass_code import dataclass
from mmm_orch.limits import ENV_NAME
from mmm_orch.walltime import format_walltime, parse_walltime

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # typing's own from Python 3.11
else:

    def dataclass_transform(**_options):  # PEP 681: a mark for type checkers only
        return lambda decorated: decorated


T = TypeVar("T")

# Field metadata of the texts that are shell code by design (setup lines, the node-list command,
# the rendezvous expressions): the profile's author wrote them to run, and they reach the job
# script as lines. Every other text is one line (first_line_break).
SHELL_LINES = {"shell_lines": True}
# What str.splitlines() breaks at: a shell ends a line at \n alone, a terminal or editor at more.
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def first_line_break(value: Any, loc: tuple = ()) -> tuple[tuple, str] | None:
    """(where, text) of the first text holding a line break in a validated profile or spec,
    keys included, skipping the SHELL_LINES fields; None when every text is one line. A comment
    line of the job script, a directive or a quoted value then stays one line."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if not f.metadata.get("shell_lines"):
                found = first_line_break(getattr(value, f.name), (*loc, f.name))
                if found:
                    return found
    elif isinstance(value, str):
        if not LINE_BREAKS.isdisjoint(value):
            return loc, value
    elif isinstance(value, dict):
        for key, item in value.items():
            found = first_line_break(key, (*loc, key)) or first_line_break(item, (*loc, key))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = first_line_break(item, (*loc, index))
            if found:
                return found
    return None


# Every class made by config(), by name: the JSON Schema's parts (config/notes.py describes them).
CONFIGURED: dict[str, type] = {}


@dataclass_transform(frozen_default=True, kw_only_default=True)
def config(cls: type[T]) -> type[T]:
    """A frozen, keyword-only dataclass whose unknown keys are validation errors."""
    CONFIGURED[cls.__name__] = cls
    pydantic_config: Any = cls
    pydantic_config.__pydantic_config__ = {"extra": "forbid"}
    return dataclass(frozen=True, kw_only=True)(cls)


class Check:
    """Annotated metadata: a validator, serializer and JSON Schema that pydantic resolves lazily."""

    def __init__(
        self,
        before: Callable | None = None,
        after: Callable | None = None,
        serialize: Callable | None = None,
        json_schema: dict | None = None,
    ):
        self.before, self.after, self.serialize, self.json_schema = (
            before,
            after,
            serialize,
            json_schema,
        )

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema as cs  # validation only: ~16 ms to import

        schema = handler(source)
        if self.after:
            schema = cs.no_info_after_validator_function(self.after, schema)
        if self.before:
            schema = cs.no_info_before_validator_function(self.before, schema)
        if self.serialize:
            schema["serialization"] = cs.plain_serializer_function_ser_schema(
                self.serialize, when_used="json"
            )
        return schema

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> Any:
        return dict(self.json_schema) if self.json_schema else handler(core_schema)


class Bound:
    """Annotated metadata: one of annotated_types' constraints (`Bound("Ge", 1)` is `Ge(1)`),
    made when pydantic asks for it. It follows annotated_types' grouped-metadata protocol, which
    pydantic expands into the constraint itself, so that the checks, the error messages and the
    JSON Schema are annotated_types' own. Importing annotated_types (with typing_extensions)
    costs ~9 ms of `mmm-orch render`'s start-up (measured on a 2-core host, 2026-11-26), and only
    validation needs it."""

    __is_annotated_types_grouped_metadata__ = True

    def __init__(self, kind: str, value: float):
        self.kind, self.value = kind, value

    def __iter__(self) -> Iterator[Any]:
        import annotated_types  # validation only: see the docstring

        yield getattr(annotated_types, self.kind)(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bound) and (self.kind, self.value) == (other.kind, other.value)

    def __hash__(self) -> int:
        return hash((self.kind, self.value))

    def __repr__(self) -> str:
        return f"Bound({self.kind!r}, {self.value!r})"


def _walltime(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("expected a walltime string such as '01:00:00'")
    if isinstance(value, int):  # YAML 1.1 reads 01:00:00 unquoted as sexagesimal seconds
        if value <= 0:
            raise ValueError("walltime must be longer than zero")
        return value
    return parse_walltime(value)


# Seconds in Python; "HH:MM:SS" in YAML, JSON output and the schema.
Walltime = Annotated[
    int,
    Check(
        before=_walltime,
        serialize=format_walltime,
        json_schema={
            "type": "string",
            "pattern": r"^(\d+-)?\d{1,3}:[0-5]\d(:[0-5]\d)?$",
            "examples": ["01:00:00"],
        },
    ),
]


def _env_name(value: str) -> str:
    if not ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value


EnvName = Annotated[str, Check(after=_env_name)]


def _scalar_to_str(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a YAML boolean is ambiguous here: quote the value, e.g. 'FALSE'")
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _trusted_shell_value(value: str) -> str:
    # Profile values are rendered inside double quotes so that $VARS expand.
    if '"' in value or "`" in value or "\n" in value:
        raise ValueError('a profile value may not contain ", ` or a newline')
    return value


ShellValue = Annotated[str, Check(before=_scalar_to_str, after=_trusted_shell_value)]

PLACEHOLDERS = {
    "nodes": 2,
    "ranks": 8,
    "ranks_per_node": 4,
    "gpus_per_node": 4,
    "cpus_per_rank": 8,
    "cpu_bind": "list:0",
    "python": "python3",
}


def check_placeholders(text: str, placeholders=PLACEHOLDERS) -> str:
    """Reject {names} that a plan cannot fill (caught when the file is loaded, not at submit)."""
    for _, name, spec, conv in string.Formatter().parse(text):
        if name is None:
            continue
        if name not in placeholders or spec or conv:
            allowed = ", ".join("{" + p + "}" for p in placeholders)
            raise ValueError(f"unknown placeholder {{{name}}} in {text!r} (allowed: {allowed})")
    return text


Templated = Annotated[str, Check(after=check_placeholders)]
# A node's address from its name in the job's node list (filled inside the job, by failover).
# A launcher argument for a run on some devices of a node: {cpus} too (config/machine.DeviceSlots).
SlotTemplated = Annotated[
    str, Check(after=lambda text: check_placeholders(text, (*PLACEHOLDERS, "cpus")))
]
NodeTemplated = Annotated[
    str, Check(after=lambda text: check_placeholders(text, ("node", "short")))
]
# A word of a balance tool's command: {account} is the project asked about.
AccountTemplated = Annotated[str, Check(after=lambda text: check_placeholders(text, ("account",)))]
NonEmptyStr = Annotated[str, Bound("MinLen", 1)]


# pydantic would take `true` for 1, `"4"` for 4 and `1` for true: a profile says what it means.
def _typed(*kinds: type, what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
            raise ValueError(f"expected {what}, not a {type(value).__name__}")
        return value

    return check


PositiveInt = Annotated[int, Check(before=_typed(int, what="a whole number")), Bound("Ge", 1)]
NonNegativeInt = Annotated[int, Check(before=_typed(int, what="a whole number")), Bound("Ge", 0)]
Number = Annotated[float, Check(before=_typed(int, float, what="a number"))]


def _finite_positive(value: float) -> float:
    if not (math.isfinite(value) and value > 0):  # a NaN would pass every comparison made with it
        raise ValueError("expected a finite number more than 0")
    return value


PositiveNumber = Annotated[
    float, Check(before=_typed(int, float, what="a number"), after=_finite_positive)
]
# A share strictly between none and all (a threshold's fraction).
Fraction = Annotated[
    float, Check(before=_typed(int, float, what="a number")), Bound("Gt", 0), Bound("Lt", 1)
]
Flag = Annotated[bool, Check(before=_typed(bool, what="true or false"))]
