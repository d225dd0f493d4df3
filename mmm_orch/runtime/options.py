"""Typed command-line options from a trainer's config dataclass: `--key-with-dashes VALUE`,
booleans as `--flag/--no-flag`, choices from Literal types. Unknown options are an error.
`--tiny` swaps in a trainer's small defaults (each option's `tiny=`); options given on the command
line still win.

A value given is held to its field's rules (`option(...)`, mmm_orch/options/run.py): every number
finite, within its bounds; text matching its pattern; names one path component; directories what
they say. A value that breaks them stops every rank with one line naming the option, the value and
what it may be, and exit 2, before the process group starts and before anything is written."""

from __future__ import annotations

import argparse
import dataclasses
import math
import operator
import os
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn

from mmm_orch.injob import runfiles
from mmm_orch.options.run import plain_type

_BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, without the usage block that would bury it."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(cls: type, argv: list[str] | None = None, tiny: dict[str, Any] | None = None) -> Any:
    """`cls` from the command line; under --tiny, the defaults its options name (`tiny=`) and
    those in `tiny`."""
    parser = _Parser(description=cls.__doc__, allow_abbrev=False)
    hints = typing.get_type_hints(cls)
    tiny = {**tiny_defaults(cls), **(tiny or {})}
    for f in dataclasses.fields(cls):
        kind = plain_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if kind is bool:
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=help_text,
            )
        elif typing.get_origin(kind) is Literal:
            choices = typing.get_args(kind)
            parser.add_argument(
                flag,
                dest=f.name,
                choices=choices,
                default=f.default,
                type=type(choices[0]),
                help=help_text,
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                type=_checked(kind, f.metadata),
                default=f.default,
                help=help_text,
            )
    if tiny and parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(**tiny)
    return cls(**vars(parser.parse_args(argv)))


def model_args(cls: type, options: Any, **given: Any) -> Any:
    """`cls` (a model's arguments) made from the trainer's options of the same names, and
    `given` for those the options name otherwise or leave out."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in given]
    return cls(
        **{name: getattr(options, name) for name in names if hasattr(options, name)}, **given
    )


def tiny_defaults(cls: type) -> dict[str, Any]:
    """The defaults --tiny swaps in: each option's `tiny=`."""
    return {f.name: f.metadata["tiny"] for f in dataclasses.fields(cls) if "tiny" in f.metadata}


def _checked(kind: type, rules: typing.Mapping[str, Any]) -> Callable[[str], Any]:
    """argparse's type for a field: the value converted, then held to the field's rules."""

    def convert(text: str) -> Any:
        value = kind(text)  # a ValueError: argparse says "invalid int value: 'x'"
        if (expected := _broken(value, rules)) is not None:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    convert.__name__ = kind.__name__
    return convert


def _broken(value: Any, rules: typing.Mapping[str, Any]) -> str | None:
    """What `value` should have been, in words, when it breaks a rule; None when it keeps all."""
    if isinstance(value, (int, float)):
        bounds = [(test, sign, rules[key]) for key, (test, sign) in _BOUNDS.items() if key in rules]
        expected = " ".join(
            [
                "a finite number" if isinstance(value, float) else "an integer",
                " and ".join(f"{sign} {bound}" for _, sign, bound in bounds),
            ]
        ).strip()
        finite = not isinstance(value, float) or math.isfinite(value)
        return None if finite and all(test(value, bound) for test, _, bound in bounds) else expected
    if rules.get("name") and value and not _one_component(value):
        return (
            "one path component: no '/', not '.' or '..', printable characters, at most 255 bytes"
        )
    if (pattern := rules.get("pattern")) and re.fullmatch(pattern, value) is None:
        return f"text matching {pattern}"
    if (directory := rules.get("directory")) and value:
        return _not_a_directory(Path(value), directory == "existing")
    return None


def _one_component(name: str) -> bool:
    return (
        "/" not in name
        and name not in (".", "..")
        and name.isprintable()
        and len(name.encode("utf-8", "surrogateescape")) <= 255
    )


def _not_a_directory(path: Path, existing: bool) -> str | None:
    """What a directory option's path should have been, when it is not a directory there (or,
    for one that may be made, the first path above it that is there is no directory)."""
    there = (
        path
        if existing
        else next((p for p in (path, *path.parents) if os.path.lexists(p)), Path("."))
    )
    if there.is_dir():  # a link to a directory is one
        return None
    if existing:
        return f"an existing directory ({path} is {runfiles.kind(path)})"
    return f"a directory or a path to make one at ({there} is {runfiles.kind(there)})"
