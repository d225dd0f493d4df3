"""Running commands here or on a login node: argument lists, never a shell string, each bounded
in time, and the commands safe to repeat retried with bounded backoff on a transient failure.
The scheduler modules and the SSH host both build on it."""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Protocol, Sequence

from mmm_orch.errors import MmmError, SchedulerError, SchedulerUnavailable


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """The command's own words: stderr, else stdout, as one line."""
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[:500]


class Runner(Protocol):
    """Runs a scheduler command here or on a login node (the SSH runner has the same shape);
    `env` adds variables for that command only."""

    def run(self, argv: Sequence[str], *, cwd: str | None = None, timeout: float = 30,
            env: dict[str, str] | None = None) -> CommandResult:
        ...


class LocalRunner:
    def run(self, argv: Sequence[str], *, cwd: str | None = None, timeout: float = 30,
            env: dict[str, str] | None = None) -> CommandResult:
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True,
                              errors="replace", timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env} if env else None)
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class Retry:
    """Bounded exponential backoff; `deadline` caps the time spent on all attempts together."""

    attempts: int = 5
    first_delay: float = 1.0
    max_delay: float = 8.0
    deadline: float = 60.0
    timeout: float = 30.0  # one command

    @classmethod
    def from_env(cls, purpose: str) -> Retry:
        """Defaults per purpose; MMM_ORCH_RETRY_DEADLINE shortens or lengthens the budget."""
        base = cls() if purpose == "submit" else cls(attempts=3, deadline=12.0, timeout=15.0)
        text = os.environ.get("MMM_ORCH_RETRY_DEADLINE")
        if text:
            try:
                deadline = float(text)
            except ValueError:
                deadline = math.nan
            if not (math.isfinite(deadline) and deadline > 0):
                raise MmmError(f"MMM_ORCH_RETRY_DEADLINE {text!r} is invalid: seconds, a number "
                               "greater than 0 (e.g. 60)")
            # Leave room for a second attempt within the budget.
            base = replace(base, deadline=deadline, timeout=min(base.timeout, deadline / 2))
        return base


def run_command(runner: Runner, argv: Sequence[str], transient: re.Pattern[str], retry: Retry,
                *, cwd: str | None = None, transient_codes: frozenset[int] = frozenset(),
                env: dict[str, str] | None = None) -> CommandResult:
    """Run until the command answers with something other than a transient failure.

    For commands that are safe to repeat (queries, cancels). Returns the result whatever its exit
    code (the caller knows which codes mean what); raises SchedulerUnavailable when every attempt
    within the budget timed out or was transient.
    """
    start = time.monotonic()
    delay = retry.first_delay
    last = ""
    for attempt in range(1, retry.attempts + 1):
        remaining = retry.deadline - (time.monotonic() - start)
        try:
            result = runner.run(argv, cwd=cwd, timeout=max(1.0, min(retry.timeout, remaining)),
                                env=env)
        except subprocess.TimeoutExpired:
            last = f"no answer within {retry.timeout:g}s"
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]}: command not found (is this the machine's login node?)")
        else:
            if result.returncode == 0 or not (
                    transient.search(result.stderr) or transient.search(result.stdout)
                    or result.returncode in transient_codes):
                return result
            last = result.message
        if attempt == retry.attempts or time.monotonic() - start + delay > retry.deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, retry.max_delay)
    raise SchedulerUnavailable(
        f"{argv[0]} failed {attempt} time(s) in {time.monotonic() - start:.0f}s: {last}")
