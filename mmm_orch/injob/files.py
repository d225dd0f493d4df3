"""The JSON files a job writes and mmm-orch reads, typed and versioned: failover.json
(FailoverState), chain.json (ChainState) and outcome.json (Outcome: how the launch ended). Part
of the protocol (protocol.py names the files); a module of its own because only their writers
and readers need the classes, and making them costs every command's start a few milliseconds.

Standard library only, importing nothing of mmm-orch but the protocol: it runs inside jobs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmm_orch.injob.protocol import (
    CHAIN_FILE,
    FAILOVER_FILE,
    LOG_FILE,
    OUTCOME_FILE,
    SCREEN_FILE,
    charge,
    write_atomically,
)

# -- the JSON files a job writes and mmm-orch reads: typed and versioned ------------------------
# A reader gets the dataclass or ProtocolFileError, never another exception: the files are
# written by the job, and so by anything that runs in it.
VERSION = 1  # of each file below; a failover.json or chain.json without one is version 1's shape

# Why a launch ended (Outcome.why).
WHY_COMPLETED = "completed"
WHY_FAILED = "failed"
WHY_HUNG = "hung"  # the watchdog ended it (EXIT_HUNG)
WHY_CHECKPOINTED = "checkpointed"  # saved before the walltime (EXIT_CHECKPOINTED)
WHY_STOPPED = "stopped"  # by the scheduler's SIGTERM or SIGINT: a cancel, the walltime
WHY_CHAIN_SKIPPED = "chain skipped"  # a chain link that did not run (EXIT_CHAIN_SKIP)
WHY_SCREENED_OUT = "screened out"  # the screen left out nodes it needed (EXIT_SCREENED_OUT)
WHYS = frozenset(
    {
        WHY_COMPLETED,
        WHY_FAILED,
        WHY_HUNG,
        WHY_CHECKPOINTED,
        WHY_STOPPED,
        WHY_CHAIN_SKIPPED,
        WHY_SCREENED_OUT,
    }
)
CHAIN_STATUSES = frozenset({"running", "finished", "stopped"})
CHARGED_FOR = frozenset({"elapsed", "walltime"})


class ProtocolFileError(ValueError):
    """A job's file that is not as a job writes it: truncated, of another shape or type."""


class ProtocolVersionError(ProtocolFileError):
    """A job's file of a version this mmm-orch does not read."""


def unreadable(name: str, exc: ProtocolFileError, writer: str = "the job writes") -> str:
    """What a reader says of file `name` that `exc` refused (a note on the job, not an error)."""
    if isinstance(exc, ProtocolVersionError):
        return f"{name} is of another mmm-orch ({str(exc).removeprefix(f'{name}: ')})"
    return f"{name} is not as {writer} it (truncated or changed)"


_KINDS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),  # (NaN and infinities are refused by _load)
    "str": lambda v: type(v) is str,
    "bool": lambda v: type(v) is bool,
    "strs": lambda v: type(v) is list and all(type(x) is str for x in v),
    "list": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict,
}
_REQUIRED: Any = object()


def _get(data: Any, key: str, kind: str, default: Any = _REQUIRED) -> Any:
    """data[key], of `kind` (`kind?`: or null); `default` where the key is absent."""
    if type(data) is not dict:
        raise ProtocolFileError(f"an object expected where {key!r} is, not {type(data).__name__}")
    if key not in data:
        if default is _REQUIRED:
            raise ProtocolFileError(f"no {key!r}")
        return default
    value = data[key]
    if value is None and kind.endswith("?"):
        return None
    if not _KINDS[kind.rstrip("?")](value):
        raise ProtocolFileError(f"{key!r} is not {kind.rstrip('?')}: {str(value)[:40]!r}")
    return tuple(value) if kind.startswith("strs") else value


def _one_of(value: str, allowed: frozenset[str], key: str) -> str:
    if value not in allowed:
        raise ProtocolFileError(
            f"{key!r} is {value[:40]!r}, not one of {', '.join(sorted(allowed))}"
        )
    return value


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is no number a job writes")


def _read(text: str | bytes, name: str, versioned: bool, build: Callable[[dict], Any]) -> Any:
    """build(the JSON object of file `name`), its version checked (`versioned`: it must have
    one); ProtocolFileError, naming the file, for anything else."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise ProtocolFileError(f"{name}: not JSON ({str(exc)[:80]})") from None
    if type(data) is not dict:
        raise ProtocolFileError(f"{name}: not a JSON object")
    if versioned or "version" in data:
        version = data.get("version")
        if type(version) is not int or version != VERSION:
            raise ProtocolVersionError(
                f"{name}: version {str(version)[:20]}; this mmm-orch reads version {VERSION}"
            )
    try:
        return build(data)
    except ProtocolFileError as exc:
        raise type(exc)(f"{name}: {exc}") from None


def _plain(value: Any) -> Any:
    """A dataclass as the files hold it: a JSON object of its fields, those unset (None) left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(v)
            for f in dataclasses.fields(value)
            if (v := getattr(value, f.name)) is not None
        }
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


# Why failover retired a node (a RetiredNode's kind, the attempt's verdict).
RETIRED_LOST = "node"  # it lost its ranks
RETIRED_HUNG = "hang"  # a hang the watchdog ended
RETIRED_STRAGGLER = "straggler"  # the trainers left it as a straggler


@dataclass(frozen=True)
class RetiredNode:
    node: str
    evidence: str
    blind: bool  # a guess (no node was named): not remembered as bad
    attempt: int | None = None  # the attempt it failed in (jobs before version 1 did not say)
    # Why: RETIRED_*, the attempt's verdict; None in jobs of an mmm-orch before it said.
    kind: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> RetiredNode:
        return cls(
            _get(data, "node", "str"),
            _get(data, "evidence", "str"),
            _get(data, "blind", "bool"),
            _get(data, "attempt", "int?", None),
            _get(data, "kind", "str?", None),
        )


@dataclass(frozen=True)
class FailoverState:
    """FAILOVER_FILE: where the failover loop stands, at each attempt and once it ended."""

    attempt: int
    attempts: int
    active: tuple[str, ...]
    spares: tuple[str, ...]
    retired: tuple[RetiredNode, ...] = ()
    verdict: str | None = None  # once it ended: the last attempt's (failover.Verdict.kind)
    reason: str | None = None
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(_plain(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FailoverState:
        return _read(
            text,
            FAILOVER_FILE,
            False,
            lambda data: cls(
                _get(data, "attempt", "int"),
                _get(data, "attempts", "int"),
                _get(data, "active", "strs"),
                _get(data, "spares", "strs"),
                tuple(map(RetiredNode.from_dict, _get(data, "retired", "list", []))),
                _get(data, "verdict", "str?", None),
                _get(data, "reason", "str?", None),
            ),
        )


@dataclass(frozen=True)
class ChainBudget:
    """What a chain's links may spend together (--max-node-hours), with the plan's rules to
    price them by."""

    limit: float
    nodes: int
    walltime: int
    factor: float
    minimum: int
    charged_for: str
    unit: str

    def charge(self, seconds: float) -> float:
        return charge(
            self.nodes,
            seconds,
            walltime=self.walltime,
            charged_for=self.charged_for,
            minimum=self.minimum,
            factor=self.factor,
        )

    @classmethod
    def from_dict(cls, data: Any) -> ChainBudget:
        return cls(
            _get(data, "limit", "number"),
            _get(data, "nodes", "int"),
            _get(data, "walltime", "int"),
            _get(data, "factor", "number"),
            _get(data, "minimum", "int"),
            _one_of(_get(data, "charged_for", "str"), CHARGED_FOR, "charged_for"),
            _get(data, "unit", "str"),
        )


@dataclass(frozen=True)
class LinkProgress:
    start_step: int
    started: float | None = None  # the link's begin (epoch)
    end_step: int | None = None  # the newest checkpoint at its end (None: none)
    exit_code: int | None = None
    ended: float | None = None  # set by the link's end: None while it runs, or if it was killed

    @classmethod
    def from_dict(cls, data: Any) -> LinkProgress:
        return cls(
            _get(data, "start_step", "int"),
            _get(data, "started", "number?", None),
            _get(data, "end_step", "int?", None),
            _get(data, "exit_code", "int?", None),
            _get(data, "ended", "number?", None),
        )


def _progress(data: dict) -> dict[int, LinkProgress]:
    links = _get(data, "progress", "object")
    if not all(re.fullmatch(r"[1-9]\d{0,8}", key) for key in links):
        raise ProtocolFileError("'progress' is not by link number")
    return {int(key): LinkProgress.from_dict(entry) for key, entry in links.items()}


@dataclass(frozen=True)
class ChainState:
    """CHAIN_FILE: a chain's state, written by mmm-orch at submission and by its links."""

    links: int
    run_dir: str
    cancel: tuple[str, ...]  # the scheduler's cancel command, a link's id added
    status: str = "running"  # CHAIN_STATUSES
    reason: str = ""
    progress: Mapping[int, LinkProgress] = field(default_factory=dict)  # by link, from 1
    budget: ChainBudget | None = None
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(_plain(self), indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> ChainState:
        return _read(
            text,
            CHAIN_FILE,
            False,
            lambda data: cls(
                _get(data, "links", "int"),
                _get(data, "run_dir", "str"),
                _get(data, "cancel", "strs"),
                _one_of(_get(data, "status", "str"), CHAIN_STATUSES, "status"),
                _get(data, "reason", "str"),
                _progress(data),
                None
                if (budget := _get(data, "budget", "object?", None)) is None
                else ChainBudget.from_dict(budget),
            ),
        )


@dataclass(frozen=True)
class ScreenedNode:
    """One node's figures in the screen: its devices' matrix products (GFLOP/s, each device's
    best window), and how its slowest device compares with the other nodes' and the peak."""

    node: str
    gflops: tuple[float, ...]  # per device; none where the node gave no figures in time
    of_median: float | None = None  # its slowest device over the other nodes' median
    of_peak: float | None = None  # over the profile's peak per device (where it has one)
    left_out: bool = False
    why: str = ""  # in words, with the figures, where it was left out
    # The ring's links (GB/s): from the node before it, and to the node after it (None where
    # not measured: one node, no answer in time, a screen before the ring); and the slower of
    # the two over the median of the other links.
    link_in: float | None = None
    link_out: float | None = None
    link_of_median: float | None = None

    @classmethod
    def from_dict(cls, data: Any) -> ScreenedNode:
        gflops = _get(data, "gflops", "list")
        if not all(type(v) in (int, float) for v in gflops):
            raise ProtocolFileError("'gflops' is not a list of numbers")
        return cls(
            _get(data, "node", "str"),
            tuple(float(v) for v in gflops),
            _get(data, "of_median", "number?", None),
            _get(data, "of_peak", "number?", None),
            _get(data, "left_out", "bool", False),
            _get(data, "why", "str", ""),
            _get(data, "link_in", "number?", None),
            _get(data, "link_out", "number?", None),
            _get(data, "link_of_median", "number?", None),
        )


@dataclass(frozen=True)
class ScreenResult:
    """SCREEN_FILE: the screen before the launch, node by node; what it cost; what it did."""

    nodes: tuple[ScreenedNode, ...]
    seconds: float  # from its start to its verdict
    verdict: str  # "passed", "left out" (the launch goes on without them), "stopped", "warned"
    version: int = VERSION

    @property
    def left_out(self) -> tuple[ScreenedNode, ...]:
        return tuple(node for node in self.nodes if node.left_out)

    def to_json(self) -> str:
        return json.dumps(_plain(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> ScreenResult:
        return _read(
            text,
            SCREEN_FILE,
            True,
            lambda data: cls(
                tuple(map(ScreenedNode.from_dict, _get(data, "nodes", "list"))),
                float(_get(data, "seconds", "number")),
                _one_of(_get(data, "verdict", "str"), SCREEN_VERDICTS, "verdict"),
            ),
        )


SCREEN_VERDICTS = frozenset({"passed", "left out", "stopped", "warned"})


@dataclass(frozen=True)
class Outcome:
    """OUTCOME_FILE: how the job's launch ended, as the in-job program that ran it saw it."""

    exit_code: int
    why: str  # WHYS
    detail: str = ""  # in words: the watchdog's or failover's verdict, the chain's
    last_step: int | None = None  # the last step=N the launch printed
    saved_step: int | None = None  # the checkpoint a resume starts from
    ended_at: float | None = None
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(_plain(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Outcome:
        return _read(
            text,
            OUTCOME_FILE,
            True,
            lambda data: cls(
                _get(data, "exit_code", "int"),
                _one_of(_get(data, "why", "str"), WHYS, "why"),
                _get(data, "detail", "str", ""),
                _get(data, "last_step", "int?", None),
                _get(data, "saved_step", "int?", None),
                _get(data, "ended_at", "number?", None),
            ),
        )


def job_dir_of_log(fd: int = 1) -> Path | None:
    """The job's directory, where `fd` (stdout) is the job's log in it (LOG_FILE): the scheduler
    opens it for the job script (Slurm's --output, PBS's -o written directly with -k doe, the
    local executor) and the script's programs inherit it. None for anything else: a pipe, a
    terminal, a copy spooled elsewhere."""
    try:
        if sys.platform.startswith("linux"):
            target = os.readlink(f"/proc/self/fd/{fd}")
        else:
            import fcntl

            getpath = getattr(fcntl, "F_GETPATH", None)  # macOS
            if getpath is None:
                return None
            target = fcntl.fcntl(fd, getpath, bytes(1024)).split(b"\0", 1)[0].decode()
        path = Path(target)
        if path.name != LOG_FILE or not os.path.samestat(os.fstat(fd), os.stat(path)):
            return None  # (also a log deleted or replaced since: its name is no longer it)
    except (OSError, ValueError):
        return None
    return path.parent


def write_outcome(outcome: Outcome, job_dir: str | Path | None = None) -> bool:
    """OUTCOME_FILE in the job's directory (`job_dir`, else the one of the log this process
    writes). Without one, or where the disk refuses it, `status` reads the job's log instead."""
    where = Path(job_dir) if job_dir is not None else job_dir_of_log()
    if where is None:
        return False
    try:
        write_atomically(where / OUTCOME_FILE, outcome.to_json())
    except OSError as exc:
        print(
            f"mmm-orch: cannot write {where / OUTCOME_FILE}: {exc.strerror or exc}",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True
