"""Typed command-line options from a trainer's config dataclass: `--key-with-dashes VALUE`,
booleans as `--flag/--no-flag`, choices from Literal types. Unknown options are an error."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal


def parse(cls: type, argv: list[str] | None = None, description: str = "") -> Any:
    parser = argparse.ArgumentParser(description=description or cls.__doc__,
                                     allow_abbrev=False)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `int | None`: optional
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=f.default, help=help_text)
        elif typing.get_origin(kind) is Literal:
            choices = typing.get_args(kind)
            parser.add_argument(flag, dest=f.name, choices=choices, default=f.default,
                                type=type(choices[0]), help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=f.default, help=help_text)
    return cls(**vars(parser.parse_args(argv)))
