"""An allocation a process runs in (an interactive `salloc` or `qsub -I`, or a batch script
someone else wrote), as found from the variables its scheduler sets for it: its id and its
nodes. Each kind reads its own (schedulers/<kind>/allocation.py; schedulers.current_allocation
asks the one whose job this is) with the helpers here, host lists among them. Pure functions of
the environment (and a node file), tested without a job."""

from __future__ import annotations

import re
from collections.abc import Mapping

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import MmmError
from mmm_orch.injob.protocol import JOB_END_VAR
from mmm_orch.limits import NODE_NAME

# Bounds on what the scheduler's variables may name: more nodes than any machine has, a node
# number of 18 digits.
MAX_NODES = 100_000
_NUMBER_DIGITS = 18


@dataclass(frozen=True)
class Allocation:
    scheduler: str  # its kind: slurm, pbs
    job_id: str
    nodes: tuple[str, ...]  # in the scheduler's order, each once
    # The fewest CPUs the allocation grants on one of its nodes, and the variable that says so
    # (None: the scheduler does not say).
    cpus_per_node: int | None = None
    cpus_said_by: str = ""
    # When its walltime runs out (epoch seconds): a job script of mmm-orch's says so
    # (protocol.JOB_END_VAR), a scheduler's own variable too (Slurm since 23.02); None where
    # nothing does.
    ends_at: float | None = None


def ends_at(env: Mapping[str, str], own_variable: str = "") -> float | None:
    """When the walltime runs out, as mmm-orch's job script says, else as the scheduler's
    `own_variable` says; None where neither does."""
    return _epoch(env, JOB_END_VAR) or (_epoch(env, own_variable) if own_variable else None)


def _epoch(env: Mapping[str, str], variable: str) -> float | None:
    """An epoch time in seconds from `variable`; None where unset, or not such a number."""
    text = env.get(variable, "")
    return float(text) if re.fullmatch(r"[0-9]{1,12}", text) and int(text) > 0 else None


def cpus_said(variable: str, value: str) -> tuple[int | None, str]:
    """(the fewest CPUs of a node, `variable=value`) from a scheduler's per-node CPU counts;
    (None, "") where it says none."""
    return (fewest_cpus(value), f"{variable}={value}") if value else (None, "")


_CPU_COUNTS = re.compile(r"^(\d{1,6})(?:\(x(\d{1,6})\))?$")


def fewest_cpus(text: str) -> int:
    """The smallest of Slurm's per-node CPU counts (`2(x3),1`: three nodes of 2, one of 1), or
    of a plain number (PBS's NCPUS)."""
    counts = []
    for part in text.split(","):
        match = _CPU_COUNTS.match(part.strip())
        if not match:
            raise MmmError(f"CPUs per node {text[:80]!r} are invalid: counts such as 2(x3),1")
        counts.append(int(match[1]))
    return min(counts)


def unique_lines(text: str) -> list[str]:
    """A PBS node file's hosts, each once, in order (it lists a host once per chunk or rank)."""
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


def node_names(text: str, source: str) -> list[str]:
    """unique_lines(text), each a node name (letters, digits, `-_.[]`: no shell syntax, no
    control characters), refused naming `source` otherwise."""
    names = unique_lines(text)
    for name in names:
        if not NODE_NAME.match(name):
            raise MmmError(
                f"{source}: node name {name[:80]!r} is invalid: letters, digits and -_.[] only"
            )
    return names


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list as names: `n[1-3,7],gpu02` -> n1 n2 n3 n7 gpu02, keeping
    zero padding (`nid[0008-0010]` -> nid0008 nid0009 nid0010); several bracket groups in one
    name expand in order (`r[1-2]n[1-2]`). A malformed list is an error naming it."""
    items = _split_top(text)
    # Counted before any is made: bracket groups multiply (`a[0-99999]b[0-99999]`).
    if sum(_count(item, text) for item in items) > MAX_NODES:
        raise MmmError(f"host list {text[:200]!r} is invalid: it names more than {MAX_NODES} nodes")
    names: list[str] = []
    for item in items:
        names += _expand_one(item, text)
    for name in names:
        if not NODE_NAME.match(name):
            raise MmmError(
                f"host list {text[:200]!r} is invalid: node name {name[:80]!r}: "
                "letters, digits and -_.[] only"
            )
    return list(dict.fromkeys(names))


def _count(item: str, whole: str) -> int:
    """How many names `item` expands to."""
    count = 1
    while (open_at := item.find("[")) >= 0:
        close_at = item.index("]", open_at)
        count *= sum(
            last - first + 1
            for first, last, _ in map(
                lambda p: _range(p, whole), item[open_at + 1 : close_at].split(",")
            )
        )
        item = item[close_at + 1 :]
    return count


def _range(part: str, whole: str) -> tuple[int, int, int]:
    """(first, last, zero-padded width) of `3`, `1-8` or `0008-0010`."""
    match = _RANGE.match(part.strip())
    if not match or any(len(g or "") > _NUMBER_DIGITS for g in match.groups()):
        raise MmmError(
            f"host list {whole[:200]!r} is malformed: {part[:40]!r} is no number or "
            f"range of at most {_NUMBER_DIGITS} digits"
        )
    first, last = int(match[1]), int(match[2] or match[1])
    if last < first:
        raise MmmError(f"host list {whole[:200]!r} is malformed: range {part!r}")
    return first, last, len(match[1])


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
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    out = []
    tails = _expand_one(rest, whole)
    for part in body.split(","):
        first, last, width = _range(part, whole)
        for number in range(first, last + 1):
            out += [f"{prefix}{number:0{width}d}{tail}" for tail in tails]
    return out
