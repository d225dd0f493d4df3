"""Typed command-line options from a trainer's config dataclass: `--key-with-dashes VALUE`,
booleans as `--flag/--no-flag`, choices from Literal types. Unknown options are an error.
`--tiny` swaps in a trainer's small defaults; options given on the command line still win."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class RunOptions:
    """Options every trainer takes; a trainer's Config adds its own after these."""

    dtype: Literal["bf16", "fp32"] = "bf16"
    seed: int = 1
    output_dir: str = "outputs"
    run_name: str = ""
    checkpoint_every: int = 0
    keep_checkpoints: int = field(default=0, metadata={
        "help": "keep the newest K checkpoints, removing older ones (0 = keep all)"})
    tensorboard: bool = field(default=False, metadata={
        "help": "TensorBoard event files in the run directory (the tensorboard extra)"})
    wandb: Literal["off", "offline", "online"] = field(default="off", metadata={
        "help": "a W&B run (the wandb extra): offline files to `wandb sync` later, or online "
                "where the compute nodes reach W&B (with the machine's proxy preset)"})
    wandb_project: str = field(default="mmm-orch", metadata={"help": "the W&B project"})
    resume: bool = field(default=False, metadata={
        "help": "continue from the run's latest checkpoint; an error when there is none"})
    allow_fresh: bool = field(default=False, metadata={
        "help": "with --resume: start from step 0 when the run has no checkpoint yet"})


def parse(cls: type, argv: list[str] | None = None, tiny: dict[str, Any] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=cls.__doc__, allow_abbrev=False)
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
    if tiny and parser.parse_known_args(argv)[0].tiny:
        parser.set_defaults(**tiny)
    return cls(**vars(parser.parse_args(argv)))
