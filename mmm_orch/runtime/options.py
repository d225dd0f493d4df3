"""Typed command-line options from a trainer's config dataclass: `--key-with-dashes VALUE`,
booleans as `--flag/--no-flag`, choices from Literal types. Unknown options are an error.
`--tiny` swaps in a trainer's small defaults (each option's `tiny=`); options given on the command
line still win.

A value given is held to its field's rules (`option(...)`): every number finite, within its
bounds; names one path component; directories what they say. A value that breaks them stops
every rank with one line naming the option, the value and what it may be, and exit 2, before
the process group starts and before anything is written."""

from __future__ import annotations

import argparse
import dataclasses
import math
import operator
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

from mmm_orch.injob import runfiles

_BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


def option(default: Any, help: str = "", *, tiny: Any = dataclasses.MISSING, **rules: Any) -> Any:
    """A Config field: its default, its --help, its default under --tiny (where it has one), and
    the rules a given value must keep: `ge`, `gt`, `le` (bounds; a float is finite besides),
    `name=True` (one path component, or ""), `directory="may-create"` (a directory, or a path one
    can be made at) or `"existing"`."""
    small = {} if tiny is dataclasses.MISSING else {"tiny": tiny}
    return field(default=default, metadata={"help": help, **small, **rules})


@dataclass(frozen=True)
class RunOptions:
    """Options every trainer takes; a trainer's Config adds its own after these."""

    dtype: Literal["bf16", "fp32"] = "bf16"
    seed: int = option(1, ge=0, le=2**32 - 1)
    output_dir: str = option("outputs", directory="may-create")
    run_name: str = option(
        "", "the run's directory in --output-dir (one path component)", name=True
    )
    checkpoint_every: int = option(0, ge=0)
    keep_checkpoints: int = option(
        0, "keep the newest K checkpoints, removing older ones (0 = keep all)", ge=0
    )
    tensorboard: bool = option(
        False, "TensorBoard event files in the run directory (the tensorboard extra)"
    )
    wandb: Literal["off", "offline", "online"] = option(
        "off",
        "a W&B run (the wandb extra): offline files to `wandb sync` later, or online "
        "where the compute nodes reach W&B (with the machine's proxy preset)",
    )
    wandb_project: str = option("mmm-orch", "the W&B project", name=True)
    resume: bool = option(
        False, "continue from the run's latest checkpoint; an error when there is none"
    )
    allow_fresh: bool = option(
        False, "with --resume: start from step 0 when the run has no checkpoint yet"
    )
    profile: str = option(
        "off",
        "torch: torch.profiler traces of a window of steps on chosen ranks, in the run "
        "directory's profile/ (Chrome/Perfetto JSON, TensorBoard's profiler plugin reads them); "
        "a machine's profiler (nsys, unitrace, rocprof) in a job mmm-orch rendered for it",
        name=True,
    )
    profile_steps: str = option("", "A:B, the steps profiled (default: 3 after the first 2)")
    profile_ranks: str = option(
        "", "the ranks profiled, comma-separated (default: local rank 0 of each node)"
    )


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
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `int | None`: optional
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
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
