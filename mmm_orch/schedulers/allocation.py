"""The allocation this process runs in (an interactive `salloc` or `qsub -I`, or a batch script
someone else wrote), found from the variables the scheduler sets for it: its id and its nodes.
Pure functions of the environment and the node file, so that they are tested without one."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from mmm_orch.errors import MmmError


@dataclass(frozen=True)
class Allocation:
    scheduler: str  # slurm, pbs
    job_id: str
    nodes: tuple[str, ...]  # in the scheduler's order, each once


def current(environ: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation of this process, or None outside any (SLURM_JOB_ID, else PBS_JOBID)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        return Allocation("slurm", env["SLURM_JOB_ID"], tuple(expand_hostlist(nodelist)))
    if env.get("PBS_JOBID"):
        nodefile = env.get("PBS_NODEFILE", "")
        try:
            text = Path(nodefile).read_text() if nodefile else ""
        except OSError as exc:
            raise MmmError(f"PBS_NODEFILE {nodefile!r}: cannot read: {exc.strerror}") from None
        return Allocation("pbs", env["PBS_JOBID"], tuple(unique_lines(text)))
    return None


def unique_lines(text: str) -> list[str]:
    """A PBS node file's hosts, each once, in order (it lists a host once per chunk or rank)."""
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list as names: `n[1-3,7],gpu02` -> n1 n2 n3 n7 gpu02, keeping
    zero padding (`nid[0008-0010]` -> nid0008 nid0009 nid0010); several bracket groups in one
    name expand in order (`r[1-2]n[1-2]`). A malformed list is an error naming it."""
    names: list[str] = []
    for item in _split_top(text):
        names += _expand_one(item, text)
    return list(dict.fromkeys(names))


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise MmmError(f"host list {text!r} is malformed: unbalanced brackets")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise MmmError(f"host list {text!r} is malformed: unbalanced brackets")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    out = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise MmmError(f"host list {whole!r} is malformed: {part!r} is no number or range")
        first, last = match[1], match[2] or match[1]
        if int(last) < int(first) or int(last) - int(first) > 100_000:
            raise MmmError(f"host list {whole!r} is malformed: range {part!r}")
        width = len(first)
        for number in range(int(first), int(last) + 1):
            out += [f"{prefix}{number:0{width}d}{tail}" for tail in _expand_one(rest, whole)]
    return out
