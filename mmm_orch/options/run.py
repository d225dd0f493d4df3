"""The options every trainer takes (RunOptions) and how a trainer's Config declares one
(`option`): its default, help, default under --tiny and the rules a value keeps. Standard library
only, below both of their readers: the trainers' command line (runtime/options.py parses a
Config and holds each value to its rules) and the workload specs (config/workload.py adds the run
options to every spec that says `run_options: true`, as `described` spells them for a spec).
A test holds each spec's other options to its trainer's Config (tests/test_spec_options.py)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal


def option(default: Any, help: str = "", *, tiny: Any = dataclasses.MISSING, **rules: Any) -> Any:
    """A Config field: its default, its --help, its default under --tiny (where it has one), and
    the rules a given value must keep: `ge`, `gt`, `le` (bounds; a float is finite besides),
    `pattern` (a regular expression the whole text matches), `name=True` (one path component, or
    ""), `directory="may-create"` (a directory, or a path one can be made at) or `"existing"`."""
    small = {} if tiny is dataclasses.MISSING else {"tiny": tiny}
    return field(default=default, metadata={"help": help, **small, **rules})


@dataclass(frozen=True)
class RunOptions:
    """Options every trainer takes; a trainer's Config adds its own after these."""

    dtype: Literal["bf16", "fp32"] = "bf16"
    seed: int = option(1, ge=0, le=2**32 - 1)
    output_dir: str = option(
        "outputs",
        "run directories go under it (relative to the submit directory)",
        directory="may-create",
    )
    run_name: str = option(
        "",
        "the run directory's name (default: the job name and its tag); name an earlier run to "
        "continue it",
        pattern=r"([A-Za-z0-9][A-Za-z0-9_.+-]{0,127})?",
        name=True,
    )
    checkpoint_every: int = option(
        0, "steps between checkpoints (0 = only on signal and before the walltime)", ge=0
    )
    keep_checkpoints: int = option(
        0, "keep the newest K checkpoints, removing older ones (0 = keep all)", ge=0
    )
    tensorboard: bool = option(
        False,
        "TensorBoard event files in the run directory (pip install 'mmm-orch[tensorboard]')",
    )
    wandb: Literal["off", "offline", "online"] = option(
        "off",
        "a W&B run (pip install 'mmm-orch[wandb]'): offline files to `wandb sync` later, or "
        "online where compute nodes reach W&B (--preset proxy on ALCF and OLCF machines)",
    )
    wandb_project: str = option(
        "mmm-orch", "the W&B project", pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name=True
    )
    resume: bool = option(
        False, "continue from the run's latest checkpoint; fails when there is none"
    )
    allow_fresh: bool = option(
        False, "with resume: start from step 0 when the run has no checkpoint yet"
    )
    profile: str = option(
        "off",
        "torch: torch.profiler traces of a window of steps on chosen ranks, in the run "
        "directory's profile/ (`mmm-orch profile JOB` summarizes them); or the machine's "
        "profiler (nsys, unitrace, rocprof: `mmm-orch show machine M`), its files in profile/ "
        "too (--profile TOOL)",
        pattern=r"[a-z][a-z0-9_-]{0,31}",
        name=True,
    )
    profile_steps: str = option(
        "",
        "A:B, the steps profiled (default: 3 after the first 2)",
        pattern=r"(\d{1,9}(:\d{1,9})?)?",
    )
    profile_ranks: str = option(
        "",
        "the ranks profiled, comma-separated (default: local rank 0 of each node)",
        pattern=r"(\d{1,6}(,\d{1,6})*)?",
    )


def described(cls: type) -> dict[str, dict[str, Any]]:
    """Each option of `cls` as a workload spec declares it (config/workload.py's Option): its
    type (a Literal is a `choice` of its values), its default (none where it is None: the
    trainer decides), bounds, pattern and help. The rules only the program can keep (a name is
    one path component, a directory is one where the job runs) are not a spec's."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        kind = plain_type(hints[f.name])
        spec: dict[str, Any] = (
            {"type": "choice", "choices": list(typing.get_args(kind))}
            if typing.get_origin(kind) is Literal
            else {"type": kind.__name__}
        )
        if f.default not in (None, dataclasses.MISSING):
            spec["default"] = f.default
        spec |= {key: f.metadata[key] for key in ("ge", "gt", "le", "pattern") if key in f.metadata}
        if f.metadata.get("help"):
            spec["help"] = f.metadata["help"]
        out[f.name] = spec
    return out


def plain_type(kind: Any) -> Any:
    """`int | None` (an option whose default the program works out) as int."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(kind) if a is not type(None))
    return kind
