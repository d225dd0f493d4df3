"""Building blocks shared by machine profiles and workload specs."""

from __future__ import annotations

import re
import string
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
)

from mmm_orch.walltime import format_walltime, parse_walltime

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Strict(BaseModel):
    """Unknown keys are errors; loaded objects never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _walltime(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("expected a walltime string such as '01:00:00'")
    if isinstance(value, int):  # YAML reads 01:00:00 unquoted as sexagesimal seconds
        if value <= 0:
            raise ValueError("walltime must be longer than zero")
        return value
    return parse_walltime(value)


# Seconds in Python, "HH:MM:SS" in YAML, JSON and the schema.
Walltime = Annotated[
    int,
    BeforeValidator(_walltime),
    PlainSerializer(format_walltime, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^(\d+-)?\d{1,3}:[0-5]\d(:[0-5]\d)?$",
                    "examples": ["01:00:00"]}),
]


def _env_name(value: str) -> str:
    if not ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]


def _env_value(value: Any) -> Any:
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


ShellValue = Annotated[str, BeforeValidator(_env_value), AfterValidator(_trusted_shell_value)]

PLACEHOLDERS = {
    "nodes": 2,
    "ranks": 8,
    "ranks_per_node": 4,
    "gpus_per_node": 4,
    "cpus_per_rank": 8,
    "cpu_bind": "list:0",
    "python": "python3",
}


def check_placeholders(text: str) -> str:
    """Reject {names} that a plan cannot fill (caught when the file is loaded, not at submit)."""
    for _, field, spec, conv in string.Formatter().parse(text):
        if field is None:
            continue
        if field not in PLACEHOLDERS or spec or conv:
            allowed = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise ValueError(f"unknown placeholder {{{field}}} in {text!r} (allowed: {allowed})")
    return text


Templated = Annotated[str, AfterValidator(check_placeholders)]

NonEmptyStr = Annotated[str, Field(min_length=1)]
